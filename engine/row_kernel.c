/* Matrix products for a few rows at a time: y (m, n) = x (m, k) w^T, float32, on AVX-512 or AVX2.
 *
 * A decode step multiplies one row by every weight of the model and a verify a few rows, so the
 * weights stream from memory once a call and the arithmetic has to hide behind that stream. The
 * weight is packed once as (n / NB, k, NB): a block of NB output columns is one contiguous run, read
 * front to back while the next is prefetched. Each row of x goes through the block in groups of at
 * most RMAX rows whose RMAX x C accumulators stay in registers.
 *
 * Every output y[r][j] is one sum over k = 0, 1, ..., k - 1 in order, one fused multiply-add a term,
 * in one vector lane: the order does not depend on how many rows the call has, which group a row
 * falls in, or which thread computes its block. So a row gets the same bits alone as with others,
 * which keeps greedy speculative text identical to plain text (engine/linear.py checks it anyway).
 *
 * Built at run time for the machine it runs on (engine/row_kernel.py: cc -O3 -march=native -fopenmp),
 * sharing PyTorch's OpenMP threads.
 */
#include <immintrin.h>
#include <omp.h>

#if defined(__AVX512F__)
typedef __m512 vec;
#define LANES 16
#define C 3    /* vectors of columns a block holds: NB = 48 */
#define RMAX 8 /* 24 accumulators, 3 weight vectors and a broadcast in 32 registers */
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VZERO() _mm512_setzero_ps()
#define VBCAST(p) _mm512_set1_ps(*(p))
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 vec;
#define LANES 8
#define C 2    /* vectors of columns a block holds: NB = 16 */
#define RMAX 6 /* 12 accumulators, 2 weight vectors and a broadcast in 16 registers */
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VZERO() _mm256_setzero_ps()
#define VBCAST(p) _mm256_broadcast_ss(p)
#else
#error "the row kernel needs AVX-512 or AVX2 with FMA"
#endif
#define NB (LANES * C)
#ifndef AHEAD
#define AHEAD 64 /* k-steps of the weight block prefetched (into L2) ahead of the first group's reads */
#endif

/* Columns a packed block holds; the last block may hold fewer, a multiple of LANES. */
int row_kernel_block(void) { return NB; }

/* Columns a vector holds: the weight's rows are padded to a multiple of this. */
int row_kernel_lanes(void) { return LANES; }

/* y[r][j0 + i] for r < R rows, i < V * LANES columns of a block packed as (k, V * LANES). */
#define KERNEL(R, V)                                                                                   \
    static void kernel_##R##_##V(const float *x, long k, const float *wb, float *y, long n, long j0,  \
                                 int ahead) {                                                          \
        vec acc[R][V];                                                                                 \
        for (int r = 0; r < R; r++)                                                                    \
            for (int c = 0; c < V; c++) acc[r][c] = VZERO();                                           \
        for (long i = 0; i < k; i++) {                                                                 \
            vec wv[V];                                                                                 \
            if (ahead)                                                                                 \
                for (int c = 0; c < V; c++)                                                            \
                    _mm_prefetch((const char *)(wb + (i + AHEAD) * V * LANES + c * LANES), _MM_HINT_T1); \
            for (int c = 0; c < V; c++) wv[c] = VLOAD(wb + (i * V + c) * LANES);                       \
            for (int r = 0; r < R; r++) {                                                              \
                vec xv = VBCAST(x + r * k + i);                                                        \
                for (int c = 0; c < V; c++) acc[r][c] = VFMA(xv, wv[c], acc[r][c]);                    \
            }                                                                                          \
        }                                                                                              \
        for (int r = 0; r < R; r++)                                                                    \
            for (int c = 0; c < V; c++) VSTORE(y + r * n + j0 + c * LANES, acc[r][c]);                 \
    }
#define KERNELS_OF(V) KERNEL(1, V) KERNEL(2, V) KERNEL(3, V) KERNEL(4, V) KERNEL(5, V) KERNEL(6, V) MORE(V)
#define ROW_OF(V) {0, kernel_1_##V, kernel_2_##V, kernel_3_##V, kernel_4_##V, kernel_5_##V, kernel_6_##V MORE_NAMES(V)}
#if RMAX > 6
#define MORE(V) KERNEL(7, V) KERNEL(8, V)
#define MORE_NAMES(V) , kernel_7_##V, kernel_8_##V
#else
#define MORE(V)
#define MORE_NAMES(V)
#endif

typedef void (*kernel_fn)(const float *, long, const float *, float *, long, long, int);
KERNELS_OF(1)
KERNELS_OF(2)
#if C > 2
KERNELS_OF(3)
static const kernel_fn KERNELS[C + 1][RMAX + 1] = {{0}, ROW_OF(1), ROW_OF(2), ROW_OF(3)};
#else
static const kernel_fn KERNELS[C + 1][RMAX + 1] = {{0}, ROW_OF(1), ROW_OF(2)};
#endif

/* y (m, n) = x (m, k) w^T, n a multiple of LANES, with w packed as blocks of NB columns, each
 * (k, NB), and a last block (k, n % NB) where NB does not divide n; the blocks split between
 * `threads` threads in contiguous runs. The first group of rows streams a block from memory
 * (prefetching ahead); later groups find it in cache. */
void row_kernel_product(const float *x, long m, long k, const float *w, long n, float *y, int threads) {
    long full = n / NB, blocks = (n + NB - 1) / NB;
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        long first = blocks * t / nt, last = blocks * (t + 1) / nt;
        for (long b = first; b < last; b++) {
            const float *wb = w + b * k * NB;
            int vectors = b < full ? C : (int)((n - full * NB) / LANES);
            for (long r = 0; r < m; r += RMAX) {
                int rows = m - r < RMAX ? (int)(m - r) : RMAX;
                KERNELS[vectors][rows](x + r * k, k, wb, y + r * n, n, b * NB, r == 0);
            }
        }
    }
}
