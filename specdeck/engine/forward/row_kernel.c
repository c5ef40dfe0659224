/* Matrix products for a few rows at a time, y (m, n) = x (m, k) w^T, and attention for a few
 * queries, float32, on AVX-512 or AVX2.
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
 * Attention after cached positions (row_kernel_attention, at the end) is here for the same reason:
 * each query reads only its own slots and sums in a fixed order, so a verify's queries share one
 * call and each gets a step's bits.
 *
 * Built at run time for the machine it runs on (engine/row_kernel.py: cc -O3 -march=native -fopenmp),
 * sharing PyTorch's OpenMP threads.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Sums of a vector's lanes, always in the same order. */
static inline float hsum4(__m128 s4) {
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
static inline float hsum8(__m256 s8) {
    return hsum4(_mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1)));
}
#if defined(__AVX512F__)
static inline float hsum16(__m512 v) {
    return hsum8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}
#endif

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
#define VSET(f) _mm512_set1_ps(f)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VDIV(a, b) _mm512_div_ps(a, b)
#define VSUB(a, b) _mm512_sub_ps(a, b)
#define VMAX(a, b) _mm512_max_ps(a, b)
#define VFNMA(a, b, c) _mm512_fnmadd_ps(a, b, c)
#define VROUND(a) _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VPOW2(n) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23))
#define VZERO_BELOW(v, x, floor) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, floor, _CMP_GE_OQ), v)
static inline float vsum(vec v) { return hsum16(v); }
static inline float vtop(vec v) { return _mm512_reduce_max_ps(v); }
/* Lanes n.. of v set to -inf. */
#define VTAIL(v, n) _mm512_mask_mov_ps(v, (__mmask16)(0xFFFFu << (n)), _mm512_set1_ps(-INFINITY))
/* The lane sums of 16 vectors in one: lane j of the result is the sum of d[FOLDED(j)]'s lanes, in
 * the order `vsum` adds them (halves, then their halves, ...), which depends on that vector alone:
 * a score's bits are those of its own lane sum, whatever slots are beside it. About 3 operations a
 * score, where a lane sum of its own takes 8. */
#define FOLDED(j) (4 * ((j) % 4) + (j) / 4)
static inline vec fold(const vec *d) {
    vec a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(d[2 * i], d[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(d[2 * i], d[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++)
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44), _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xDD));
}
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
#define VSET(f) _mm256_set1_ps(f)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VDIV(a, b) _mm256_div_ps(a, b)
#define VSUB(a, b) _mm256_sub_ps(a, b)
#define VMAX(a, b) _mm256_max_ps(a, b)
#define VFNMA(a, b, c) _mm256_fnmadd_ps(a, b, c)
#define VROUND(a) _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VPOW2(n) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23))
#define VZERO_BELOW(v, x, floor) _mm256_and_ps(_mm256_cmp_ps(x, floor, _CMP_GE_OQ), v)
static inline float vsum(vec v) { return hsum8(v); }
static inline float vtop(vec v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
}
#define VTAIL(v, n)                                                                                    \
    _mm256_blendv_ps(v, _mm256_set1_ps(-INFINITY),                                                     \
                     _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((n) - 1))))
/* The lane sums of 8 vectors in one, as the AVX-512 build's `fold` does for 16. */
#define FOLDED(j) (2 * ((j) % 4) + (j) / 4)
static inline vec fold(const vec *d) {
    vec a[4], b[2];
    for (int i = 0; i < 4; i++)
        a[i] = _mm256_add_ps(_mm256_permute2f128_ps(d[2 * i], d[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(d[2 * i], d[2 * i + 1], 0x31));
    for (int i = 0; i < 2; i++)
        b[i] = _mm256_add_ps(_mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44), _mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE));
    return _mm256_add_ps(_mm256_shuffle_ps(b[0], b[1], 0x88), _mm256_shuffle_ps(b[0], b[1], 0xDD));
}
#else
#error "the row kernel needs AVX-512 or AVX2 with FMA"
#endif
#define NB (LANES * C)
/* v held in a register as it is now: the compiler would otherwise fold its load into each use, or
 * put off the adds into it */
#define KEEP(v) __asm__("" : "+v"(v))
#ifndef AHEAD
#define AHEAD 64 /* k-steps of the weight block prefetched (into L2) ahead of the first group's reads */
#endif

/* Columns a packed block holds; the last block may hold fewer, a multiple of LANES. */
int row_kernel_block(void) { return NB; }

/* Columns a vector holds: the weight's rows are padded to a multiple of this. */
int row_kernel_lanes(void) { return LANES; }

/* A kernel's R x V accumulators set to zero, and stored as rows r of y at columns j0 + c LANES. */
#define ACC_ZERO(R, V)                                                                                 \
    for (int r = 0; r < R; r++)                                                                        \
        for (int c = 0; c < V; c++) acc[r][c] = VZERO()
#define ACC_STORE(R, V)                                                                                \
    for (int r = 0; r < R; r++)                                                                        \
        for (int c = 0; c < V; c++) VSTORE(y + r * n + j0 + c * LANES, acc[r][c])

/* y[r][j0 + i] for r < R rows, i < V * LANES columns of a block packed as (k, V * LANES). */
#define KERNEL(R, V)                                                                                   \
    static void kernel_##R##_##V(const float *x, long k, const float *wb, float *y, long n, long j0,  \
                                 int ahead) {                                                          \
        vec acc[R][V];                                                                                 \
        ACC_ZERO(R, V);                                                                                \
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
        ACC_STORE(R, V);                                                                               \
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
static void product_part(int t, int nt, const float *x, long m, long k, const float *w, long n, float *y) {
    long full = n / NB, blocks = (n + NB - 1) / NB;
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

void row_kernel_product(const float *x, long m, long k, const float *w, long n, float *y, int threads) {
#pragma omp parallel num_threads(threads)
    product_part(omp_get_thread_num(), omp_get_num_threads(), x, m, k, w, n, y);
}

/* Products on weights kept as a GGUF file stores them, in blocks of 32 along the inner dimension:
 * Q4_1 (a float16 scale d and minimum m a block, 4-bit q: w = d q + m) and Q8_0 (a float16 scale d,
 * 8-bit signed q: w = d q). A weight of 4.5 or 8.5 bits streams a fraction of float32's bytes and
 * SmolLM2-135M's whole model stays in a large L3. Each weight is decoded in registers to the value
 * gguf-py's dequantization gives it (d q is exact in float32, an 11-bit scale times a 4- or 8-bit
 * integer, so only + m rounds, once, fused or not), and summed exactly as `row_kernel_product`
 * sums the decoded matrix: one fused multiply-add a term in k order. So a product gives the bits of
 * the float32 product of the file's dequantized weights, whatever the number of rows.
 *
 * Packed per block of columns (V vectors of LANES columns, V = C but for a narrower last block),
 * group by group of 32 k-steps:
 *   Q4_1: d (V LANES float16), m (V LANES float16), then for each pair p < 16 of k-steps and each
 *         vector c, LANES bytes: column's q at k = 2p in the low nibble, at 2p + 1 in the high;
 *   Q8_0: d (V LANES float16), then for each k-step < 32 and each vector c, LANES signed bytes. */
#if defined(__AVX512F__)
typedef __m512i ivec;
#define QU8(p) _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define QS8(p) _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define QLOW(q) _mm512_and_si512(q, _mm512_set1_epi32(15))
#define QHIGH(q) _mm512_srli_epi32(q, 4)
#define QFLOAT(q) _mm512_cvtepi32_ps(q)
#define VHALF(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define RQ 8 /* 24 accumulators, a weight vector and its quants in 32 registers */
#else
#if !defined(__F16C__)
#error "the row kernel's quantized products need F16C beside AVX2"
#endif
typedef __m256i ivec;
#define QU8(p) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define QS8(p) _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define QLOW(q) _mm256_and_si256(q, _mm256_set1_epi32(15))
#define QHIGH(q) _mm256_srli_epi32(q, 4)
#define QFLOAT(q) _mm256_cvtepi32_ps(q)
#define VHALF(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define RQ 6 /* 12 accumulators, a weight vector and its quants in 16 registers */
#endif
#define QK 32 /* k-steps a quantized block spans */

/* Bytes of one group of 32 k-steps of a packed block of `vectors` vectors of columns. */
#define Q4_GROUP(vectors) ((long)(vectors) * LANES * 20)
#define Q8_GROUP(vectors) ((long)(vectors) * LANES * 34)

/* Every cache line of `bytes` at p, fetched ahead: the hardware's prefetchers alone left products
 * over 8 rows waiting on memory (211 products of SmolLM2-135M, 8-bit rows, on a 2-core Xeon: 9.9
 * ms a pass with one line of a group fetched ahead, 6.5 with all of them 16 groups ahead). */
#define PREFETCH_GROUP(p, bytes)                                                                       \
    for (int line = 0; line < (bytes); line += 64) _mm_prefetch((const char *)(p) + line, _MM_HINT_T0)

/* A group's scales (and minimums) as float32, for the kernels' multiplies to read from L1. */
static inline void halves(const uint8_t *h, int count, float *out) {
    for (int i = 0; i < count; i += LANES) VSTORE(out + i, VHALF(h + 2 * i));
}

/* d q + m in one fused multiply-add: d q is exact, so its one rounding is gguf-py's. Each vector
 * of columns is decoded once a pair of k-steps and multiplied into all R rows' accumulators. */
#define Q4_KERNEL(R, V)                                                                                \
    static void q4_##R##_##V(const float *x, long k, const uint8_t *wb, float *y, long n, long j0) {    \
        vec acc[R][V];                                                                                 \
        float d[V * LANES], m[V * LANES];                                                              \
        ACC_ZERO(R, V);                                                                                \
        for (long g = 0; g < k / QK; g++, wb += Q4_GROUP(V)) {                                         \
            const uint8_t *qs = wb + V * LANES * 4;                                                    \
            PREFETCH_GROUP(wb + 4 * Q4_GROUP(V), Q4_GROUP(V));                                         \
            halves(wb, V * LANES, d);                                                                  \
            halves(wb + V * LANES * 2, V * LANES, m);                                                  \
            for (int p = 0; p < QK / 2; p++) {                                                         \
                const float *xi = x + g * QK + 2 * p;                                                  \
                for (int c = 0; c < V; c++) {                                                          \
                    ivec q = QU8(qs + (p * V + c) * LANES);                                            \
                    vec dc = VLOAD(d + c * LANES), mc = VLOAD(m + c * LANES);                          \
                    vec w = VFMA(QFLOAT(QLOW(q)), dc, mc);                                             \
                    for (int r = 0; r < R; r++) acc[r][c] = VFMA(VBCAST(xi + r * k), w, acc[r][c]);    \
                    w = VFMA(QFLOAT(QHIGH(q)), dc, mc);                                                \
                    for (int r = 0; r < R; r++) acc[r][c] = VFMA(VBCAST(xi + r * k + 1), w, acc[r][c]); \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
        ACC_STORE(R, V);                                                                               \
    }

#define Q8_KERNEL(R, V)                                                                                \
    static void q8_##R##_##V(const float *x, long k, const uint8_t *wb, float *y, long n, long j0) {    \
        vec acc[R][V];                                                                                 \
        float d[V * LANES];                                                                            \
        ACC_ZERO(R, V);                                                                                \
        for (long g = 0; g < k / QK; g++, wb += Q8_GROUP(V)) {                                         \
            const uint8_t *qs = wb + V * LANES * 2;                                                    \
            PREFETCH_GROUP(wb + 2 * Q8_GROUP(V), Q8_GROUP(V));                                         \
            halves(wb, V * LANES, d);                                                                  \
            for (int i = 0; i < QK; i++) {                                                             \
                const float *xi = x + g * QK + i;                                                      \
                for (int c = 0; c < V; c++) {                                                          \
                    vec w = VMUL(QFLOAT(QS8(qs + (i * V + c) * LANES)), VLOAD(d + c * LANES));          \
                    for (int r = 0; r < R; r++) acc[r][c] = VFMA(VBCAST(xi + r * k), w, acc[r][c]);    \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
        ACC_STORE(R, V);                                                                               \
    }

typedef void (*qkernel_fn)(const float *, long, const uint8_t *, float *, long, long);
#define Q_KERNELS_OF(KIND, V) KIND##_KERNEL(1, V) KIND##_KERNEL(2, V) KIND##_KERNEL(3, V) Q_MORE(KIND, V)
#define Q_ROW_OF(kind, V) {0, kind##_1_##V, kind##_2_##V, kind##_3_##V Q_MORE_NAMES(kind, V)}
#if RQ > 6
#define Q_MORE(KIND, V) KIND##_KERNEL(4, V) KIND##_KERNEL(5, V) KIND##_KERNEL(6, V) KIND##_KERNEL(7, V) KIND##_KERNEL(8, V)
#define Q_MORE_NAMES(kind, V) , kind##_4_##V, kind##_5_##V, kind##_6_##V, kind##_7_##V, kind##_8_##V
#else
#define Q_MORE(KIND, V) KIND##_KERNEL(4, V) KIND##_KERNEL(5, V) KIND##_KERNEL(6, V)
#define Q_MORE_NAMES(kind, V) , kind##_4_##V, kind##_5_##V, kind##_6_##V
#endif
Q_KERNELS_OF(Q4, 1)
Q_KERNELS_OF(Q4, 2)
Q_KERNELS_OF(Q8, 1)
Q_KERNELS_OF(Q8, 2)
#if C > 2
Q_KERNELS_OF(Q4, 3)
Q_KERNELS_OF(Q8, 3)
static const qkernel_fn Q4_KERNELS[C + 1][RQ + 1] = {{0}, Q_ROW_OF(q4, 1), Q_ROW_OF(q4, 2), Q_ROW_OF(q4, 3)};
static const qkernel_fn Q8_KERNELS[C + 1][RQ + 1] = {{0}, Q_ROW_OF(q8, 1), Q_ROW_OF(q8, 2), Q_ROW_OF(q8, 3)};
#else
static const qkernel_fn Q4_KERNELS[C + 1][RQ + 1] = {{0}, Q_ROW_OF(q4, 1), Q_ROW_OF(q4, 2)};
static const qkernel_fn Q8_KERNELS[C + 1][RQ + 1] = {{0}, Q_ROW_OF(q8, 1), Q_ROW_OF(q8, 2)};
#endif

/* y (m, n) = x (m, k) w^T for w packed as above (`kind` 0: Q4_1, 1: Q8_0); k a multiple of 32, n of
 * LANES; blocks split between threads as in `row_kernel_product`. */
static void quantized_part(int t, int nt, int kind, const float *x, long m, long k, const uint8_t *w, long n,
                           float *y) {
    long full = n / NB, blocks = (n + NB - 1) / NB, groups = k / QK;
    long first = blocks * t / nt, last = blocks * (t + 1) / nt;
    for (long b = first; b < last; b++) {
        int vectors = b < full ? C : (int)((n - full * NB) / LANES);
        const uint8_t *wb = w + b * groups * (kind ? Q8_GROUP(C) : Q4_GROUP(C));
        for (long r = 0; r < m; r += RQ) {
            int rows = m - r < RQ ? (int)(m - r) : RQ;
            (kind ? Q8_KERNELS : Q4_KERNELS)[vectors][rows](x + r * k, k, wb, y + r * n, n, b * NB);
        }
    }
}

/* ---- Float32 rows on the other GGUF block types: kinds 4 to 9 ----
 *
 * Q4_0, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K each decode, in gguf-py's dequantization, to w = s q + mn:
 * q a small unsigned integer, s a scale and mn an offset per group of 32 k-steps (Q6_K: 16),
 *   Q4_0: s = d, mn = -8 d;      Q5_0: s = d, mn = -16 d;      Q5_1: s = d, mn = m;
 *   Q4_K, Q5_K: s = d sc, mn = -dmin mc (sc, mc: the sub-block's 6-bit scale and minimum);
 *   Q6_K: s = d sc, mn = -32 s (sc: the sub-block's 8-bit signed scale).
 * s is exact in float32 (an 11-bit float16 times an integer of at most 8 bits), and so is s q (at
 * most 24 bits), so fma(q, s, mn) rounds once, where gguf-py's s q + mn does, to the same value; where
 * mn is -2^j s the value s (q - 2^j) is itself a float32 and nothing rounds. So one layout and one
 * kernel serve every type (`engine/forward/block_codes.py` packs them), and each output is again one
 * fused multiply-add a term in k order, as `row_kernel_product` sums the dequantized matrix.
 *
 * Packed per block of columns (V vectors of LANES columns), group by group of G k-steps:
 *   s (V LANES float32); mn (V LANES float32) where the type has minimums (an offset of 0 below;
 *   else mn = -offset s is computed here, a float a column and group fewer to stream); where q has
 *   more than 4 bits, its high bits (V LANES uint32: k-step i's at bits H i .. H i + H - 1); then for
 *   each pair p < G / 2 of k-steps and each vector c, LANES bytes: q's low 4 bits at k = 2p in the
 *   low nibble, at 2p + 1 in the high (Q4_1's order). */
struct code_type {
    int group;  /* k-steps sharing a scale: G */
    int high;   /* bits of q above the low 4: H */
    int offset; /* mn = -offset s; 0: mn stored */
};
#define CODE_KINDS 4 /* the kind number of the first entry */
static const struct code_type CODE_TYPES[] = {
    {32, 0, 8},  /* 4: Q4_0 */
    {32, 1, 16}, /* 5: Q5_0 */
    {32, 1, 0},  /* 6: Q5_1 */
    {32, 0, 0},  /* 7: Q4_K */
    {32, 1, 0},  /* 8: Q5_K */
    {16, 2, 32}, /* 9: Q6_K */
};
#define CODE_LAST (CODE_KINDS + (int)(sizeof CODE_TYPES / sizeof CODE_TYPES[0]) - 1)

/* Bytes of one group of a packed block of `vectors` vectors of columns. */
static inline long code_group_bytes(int group, int high, int offset, int vectors) {
    return (long)vectors * LANES * (4 + (offset ? 0 : 4) + (high ? 4 : 0) + group / 2);
}

#if defined(__AVX512F__)
#define RC RQ /* rows a kernel call takes */
#define CLOAD(p) _mm512_loadu_si512((const void *)(p))
#define CSET(i) _mm512_set1_epi32(i)
#define CSHR(v, n) _mm512_srli_epi32(v, n)
#define CSHL(v, n) _mm512_slli_epi32(v, n)
#define CAND(a, b) _mm512_and_si512(a, b)
#define COR(a, b) _mm512_or_si512(a, b)
#else
#define RC 4 /* 8 accumulators beside the decoding's registers: 6 rows spilled them to the stack */
#define CLOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define CSET(i) _mm256_set1_epi32(i)
#define CSHR(v, n) _mm256_srli_epi32(v, n)
#define CSHL(v, n) _mm256_slli_epi32(v, n)
#define CAND(a, b) _mm256_and_si256(a, b)
#define COR(a, b) _mm256_or_si256(a, b)
#endif

/* y[r][j0 + i] for r < R rows, i < V LANES columns of a block packed as above, G k-steps a group and
 * H high bits. Each vector of columns is decoded once a pair of k-steps, q = low | high << 4 in
 * integers and w = fma(q, s, mn), and multiplied into all R rows' accumulators. Inlined where R, V,
 * G and H are constants (`CODE_KERNEL`), so the compiler unrolls it and keeps the accumulators in
 * registers. */
static inline __attribute__((always_inline)) void codes(int R, int V, int G, int H, const float *x, long k,
                                                        const uint8_t *wb, float *y, long n, long j0, int offset) {
    vec acc[RC][C];
    float mins[C * LANES];
    long size = code_group_bytes(G, H, offset, V);
    ACC_ZERO(R, V);
    for (long g = 0; g < k / G; g++, wb += size) {
        const float *s = (const float *)wb, *mn = offset ? mins : s + V * LANES;
        const uint8_t *hs = wb + V * LANES * (offset ? 4 : 8), *qs = hs + (H ? V * LANES * 4 : 0);
        PREFETCH_GROUP(wb + 128 / G * size, size);
        if (offset)
            for (int c = 0; c < V; c++) VSTORE(mins + c * LANES, VMUL(VLOAD(s + c * LANES), VSET((float)-offset)));
        for (int p = 0; p < G / 2; p++) {
            const float *xi = x + g * G + 2 * p;
            for (int c = 0; c < V; c++) {
                ivec q = QU8(qs + (p * V + c) * LANES), low = QLOW(q), high = QHIGH(q);
                if (H) {
                    ivec h = CSHR(CLOAD(hs + c * LANES * 4), 2 * H * p), top = CSET(((1 << H) - 1) << 4);
                    low = COR(low, CAND(CSHL(h, 4), top));
                    high = COR(high, CAND(CSHL(h, 4 - H), top));
                }
                vec sc = VLOAD(s + c * LANES), mc = VLOAD(mn + c * LANES);
                vec w = VFMA(QFLOAT(low), sc, mc);
                for (int r = 0; r < R; r++) acc[r][c] = VFMA(VBCAST(xi + r * k), w, acc[r][c]);
                w = VFMA(QFLOAT(high), sc, mc);
                for (int r = 0; r < R; r++) acc[r][c] = VFMA(VBCAST(xi + r * k + 1), w, acc[r][c]);
            }
        }
    }
    ACC_STORE(R, V);
}

/* The kernels by H (which fixes G: 32, 32, 16), vectors of columns and rows. */
#define CODE_KERNEL(H, R, V)                                                                           \
    static void code_##H##_##R##_##V(const float *x, long k, const uint8_t *wb, float *y, long n, long j0,  \
                                     int offset) {                                                     \
        codes(R, V, (H) == 2 ? 16 : 32, H, x, k, wb, y, n, j0, offset);                                \
    }
#define CODE_ROW(H, V)                                                                                 \
    CODE_KERNEL(H, 1, V) CODE_KERNEL(H, 2, V) CODE_KERNEL(H, 3, V) CODE_KERNEL(H, 4, V) CODE_MORE(H, V)
#define CODE_NAMES(H, V)                                                                               \
    {0, code_##H##_1_##V, code_##H##_2_##V, code_##H##_3_##V, code_##H##_4_##V CODE_MORE_NAMES(H, V)}
#if RC > 4
#define CODE_MORE(H, V) CODE_KERNEL(H, 5, V) CODE_KERNEL(H, 6, V) CODE_KERNEL(H, 7, V) CODE_KERNEL(H, 8, V)
#define CODE_MORE_NAMES(H, V) , code_##H##_5_##V, code_##H##_6_##V, code_##H##_7_##V, code_##H##_8_##V
#else
#define CODE_MORE(H, V)
#define CODE_MORE_NAMES(H, V)
#endif
#if C > 2
#define CODE_KERNELS_OF(H) CODE_ROW(H, 1) CODE_ROW(H, 2) CODE_ROW(H, 3)
#define CODE_TABLE_OF(H) {{0}, CODE_NAMES(H, 1), CODE_NAMES(H, 2), CODE_NAMES(H, 3)}
#else
#define CODE_KERNELS_OF(H) CODE_ROW(H, 1) CODE_ROW(H, 2)
#define CODE_TABLE_OF(H) {{0}, CODE_NAMES(H, 1), CODE_NAMES(H, 2)}
#endif
typedef void (*code_fn)(const float *, long, const uint8_t *, float *, long, long, int);
CODE_KERNELS_OF(0)
CODE_KERNELS_OF(1)
CODE_KERNELS_OF(2)
static const code_fn CODE_KERNELS[3][C + 1][RC + 1] = {CODE_TABLE_OF(0), CODE_TABLE_OF(1), CODE_TABLE_OF(2)};

/* y (m, n) = x (m, k) w^T for w packed as above (`kind` 4 to 9); k a multiple of the type's group,
 * n of LANES; blocks split between threads as in `row_kernel_product`. */
static void codes_part(int t, int nt, int kind, const float *x, long m, long k, const uint8_t *w, long n, float *y) {
    const struct code_type *type = &CODE_TYPES[kind - CODE_KINDS];
    long full = n / NB, blocks = (n + NB - 1) / NB, groups = k / type->group;
    long first = blocks * t / nt, last = blocks * (t + 1) / nt;
    for (long b = first; b < last; b++) {
        int vectors = b < full ? C : (int)((n - full * NB) / LANES);
        const uint8_t *wb = w + b * groups * code_group_bytes(type->group, type->high, type->offset, C);
        for (long r = 0; r < m; r += RC) {
            int rows = m - r < RC ? (int)(m - r) : RC;
            CODE_KERNELS[type->high][vectors][rows](x + r * k, k, wb, y + r * n, n, b * NB, type->offset);
        }
    }
}
/* ---- end of the float32 rows on kinds 4 to 9 ---- */


/* Products on the same blocks with the activations in 8 bits, as llama.cpp multiplies them: each
 * row's group of 32 values x becomes a float scale s = max |x| / 127 and 32 integers a = round(x / s)
 * (kept with their sum), and a group's dot product with a column's quants is one exact integer sum
 * of 4-byte products (VNNI's dpbusd: 64 of them an instruction on AVX-512, against 16 float32
 * multiply-adds; AVX2 without VNNI sums the same integers with maddubs), scaled once a group: y += (d s) sum(q a) + m (s sum(a)) for Q4_1, y += (d s)
 * (sum((q + 128) a) - 128 sum(a)) for Q8_0 (its quants kept offset, unsigned). The integers are
 * exact and a row's scaling runs group by group in k order, so a row's bits still do not depend on
 * the rows beside it; they differ from the float32 product by the activations' 8-bit rounding.
 *
 * Packed per vector of LANES columns, group by group of 32 k-steps (kinds 2 and 3):
 *   Q4_1: d, m (LANES float16 each), then four runs of LANES x 4 bytes: in run u, column j's four
 *         bytes are the file's quant bytes 4u .. 4u + 3 of its block (low nibbles: k = 4u + b,
 *         high nibbles: k = 16 + 4u + b);
 *   Q8_0: d (LANES float16), then eight runs of LANES x 4 bytes: in run u, column j's q + 128 at
 *         k = 4u .. 4u + 3. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#define INT8_ACTIVATIONS 1
#define ILOAD(p) _mm512_loadu_si512((const void *)(p))
#define IZERO() _mm512_setzero_si512()
#define IDOT(acc, u, p) _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32(*(const int32_t *)(p)))
#define INIBBLE(v, shift) _mm512_and_si512(_mm512_srli_epi16(v, shift), _mm512_set1_epi8(15))
#define Q4_DOT(acc, u, p) IDOT(acc, u, p)
#define Q4_SUM(acc) (acc)
#define Q8_WEIGHTS(v) (v)
#define Q8_DOT(acc, w, p) IDOT(acc, w, p)
#define Q8_SUM(acc, sum) _mm512_sub_epi32(acc, _mm512_set1_epi32(128 * (sum)))
#define RI 8 /* 8 integer and 8 float accumulators, the quants and scales in 32 registers */
#define VABS(v) _mm512_abs_ps(v)
static inline float vmax(__m512 v) { return _mm512_reduce_max_ps(v); }
/* The lanes rounded to the nearest integer (even on ties) and stored as bytes; their sum. */
static inline int32_t ROUND_TO_BYTES(__m512 v, int8_t *out) {
    __m512i q = _mm512_cvtps_epi32(v);
    _mm_storeu_si128((__m128i *)out, _mm512_cvtepi32_epi8(q));
    return _mm512_reduce_add_epi32(q);
}
#elif defined(__AVX2__) && !defined(__AVX512F__)
#define INT8_ACTIVATIONS 1
#define ILOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define IZERO() _mm256_setzero_si256()
#define IBCAST(p) _mm256_set1_epi32(*(const int32_t *)(p))
#define INIBBLE(v, shift) _mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8(15))
#define RI 4 /* 4 integer and 4 float accumulators, the quants and scales in 16 registers */
#define VABS(v) _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)))
static inline float vmax(__m256 v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
}
static inline int32_t ROUND_TO_BYTES(__m256 v, int8_t *out) {
    int32_t q[8], sum = 0;
    _mm256_storeu_si256((__m256i *)q, _mm256_cvtps_epi32(v));
    for (int i = 0; i < 8; i++) out[i] = (int8_t)q[i], sum += q[i];
    return sum;
}
#if defined(__AVXVNNI__)
#define IDOT(acc, u, p) _mm256_dpbusd_avx_epi32(acc, u, IBCAST(p))
#define Q4_DOT(acc, u, p) IDOT(acc, u, p)
#define Q4_SUM(acc) (acc)
#define Q8_WEIGHTS(v) (v)
#define Q8_DOT(acc, w, p) IDOT(acc, w, p)
#define Q8_SUM(acc, sum) _mm256_sub_epi32(acc, _mm256_set1_epi32(128 * (sum)))
#else
/* No VNNI: pairs of byte products summed into 16 bits (maddubs), then pairs of those into 32. A Q4_1
 * quant times a byte is at most 15 x 127, so a group's 8 runs add up in 16 bits (16 products a
 * lane) before widening; Q8_0's products can reach 128 x 127, so each run widens at once, and its
 * quants are turned back to signed bytes: maddubs multiplies |q| by a with q's sign. The sums are
 * the same integers as with VNNI. */
#define Q4_DOT(acc, u, p) _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, IBCAST(p)))
#define Q4_SUM(acc) _mm256_madd_epi16(acc, _mm256_set1_epi16(1))
#define Q8_WEIGHTS(v) _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80))
#define Q8_DOT(acc, w, p)                                                                              \
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(IBCAST(p), w)), \
                                            _mm256_set1_epi16(1)))
#define Q8_SUM(acc, sum) (acc)
#endif
#else
#define INT8_ACTIVATIONS 0
#endif

/* 1 where this build multiplies the blocks with 8-bit activations (kinds 2 and 3), else 0. */
int row_kernel_int8(void) { return INT8_ACTIVATIONS; }

#if INT8_ACTIVATIONS
/* Each row's spans of `span` values (32, or a K-quant block's 256) as 8-bit integers a (m, k), one
 * scale s a span (m, k / span), and each group of 32's sum(a) and the sums of its two halves of 16
 * (m, k / 32; `halves`: the first half's in the low 16 bits, the second's in the high): the
 * reciprocal 127 / max |x| rounded once, each a = x times it rounded to nearest (even on ties), lane
 * by lane; a row's numbers depend on its own values only. */
static void quantize_rows(const float *x, long m, long k, int span, int8_t *a, float *s, int32_t *sums,
                          int32_t *halves) {
    for (long r = 0; r < m; r++)
        for (long b = 0; b < k / span; b++) {
            const float *xb = x + r * k + b * span;
            vec top = VABS(VLOAD(xb));
            for (int i = LANES; i < span; i += LANES) top = VMAX(top, VABS(VLOAD(xb + i)));
            float most = vmax(top), inverse = most > 0.0f ? 127.0f / most : 0.0f;
            s[r * (k / span) + b] = most / 127.0f;
            for (int g = 0; g < span / QK; g++) {
                int32_t half[2] = {0, 0};
                for (int i = 0; i < QK; i += LANES)
                    half[i / 16] += ROUND_TO_BYTES(VMUL(VLOAD(xb + g * QK + i), VSET(inverse)),
                                                   a + r * k + b * span + g * QK + i);
                long at = r * (k / QK) + b * (span / QK) + g;
                sums[at] = half[0] + half[1];
                halves[at] = (int32_t)(((uint32_t)half[1] << 16) | ((uint32_t)half[0] & 0xFFFFu));
            }
        }
}

#define IAHEAD 16 /* groups ahead that the 8-bit-row kernels of the other block types fetch */
/* Q4_1's and Q8_0's fetch half as far: a step streams them from memory, and fetching further ahead
 * made it slower on the machines measured (docs/journal/2026-11-29-prefetch-distance.md). */
#define I8AHEAD 8
#define I4_KERNEL(R)                                                                                   \
    static void i4_##R(const int8_t *a, const float *s, const float *sm, const int32_t *sums, long k,  \
                       const uint8_t *wb, float *y, long n, long j0) {                                 \
        vec acc[R];                                                                                    \
        long groups = k / QK;                                                                          \
        (void)sums;                                                                                    \
        for (int r = 0; r < R; r++) acc[r] = VZERO();                                                  \
        for (long g = 0; g < groups; g++, wb += LANES * 20) {                                          \
            PREFETCH_GROUP(wb + I8AHEAD * LANES * 20, LANES * 20);                                     \
            ivec dot[R];                                                                               \
            for (int r = 0; r < R; r++) dot[r] = IZERO();                                              \
            for (int u = 0; u < 4; u++) {                                                              \
                ivec v = ILOAD(wb + LANES * 4 + u * LANES * 4);                                        \
                ivec low = INIBBLE(v, 0), high = INIBBLE(v, 4);                                        \
                const int8_t *au = a + g * QK + 4 * u;                                                 \
                for (int r = 0; r < R; r++) dot[r] = Q4_DOT(dot[r], low, au + r * k);                  \
                for (int r = 0; r < R; r++) dot[r] = Q4_DOT(dot[r], high, au + r * k + 16);            \
            }                                                                                          \
            vec d = VHALF(wb), mins = VHALF(wb + LANES * 2);                                           \
            for (int r = 0; r < R; r++) {                                                              \
                acc[r] = VFMA(QFLOAT(Q4_SUM(dot[r])), VMUL(d, VSET(s[r * groups + g])), acc[r]);       \
                acc[r] = VFMA(mins, VSET(sm[r * groups + g]), acc[r]);                                 \
            }                                                                                          \
        }                                                                                              \
        for (int r = 0; r < R; r++) VSTORE(y + r * n + j0, acc[r]);                                    \
    }

#define I8_KERNEL(R)                                                                                   \
    static void i8_##R(const int8_t *a, const float *s, const float *sm, const int32_t *sums, long k,  \
                       const uint8_t *wb, float *y, long n, long j0) {                                 \
        vec acc[R];                                                                                    \
        long groups = k / QK;                                                                          \
        (void)sm;                                                                                      \
        for (int r = 0; r < R; r++) acc[r] = VZERO();                                                  \
        for (long g = 0; g < groups; g++, wb += LANES * 34) {                                          \
            PREFETCH_GROUP(wb + I8AHEAD * LANES * 34, LANES * 34);                                     \
            ivec dot[R];                                                                               \
            for (int r = 0; r < R; r++) dot[r] = IZERO();                                              \
            for (int u = 0; u < 8; u++) {                                                              \
                ivec v = Q8_WEIGHTS(ILOAD(wb + LANES * 2 + u * LANES * 4));                            \
                const int8_t *au = a + g * QK + 4 * u;                                                 \
                for (int r = 0; r < R; r++) dot[r] = Q8_DOT(dot[r], v, au + r * k);                    \
            }                                                                                          \
            vec d = VHALF(wb);                                                                         \
            for (int r = 0; r < R; r++) {                                                              \
                vec sum = QFLOAT(Q8_SUM(dot[r], sums[r * groups + g]));                                \
                acc[r] = VFMA(sum, VMUL(d, VSET(s[r * groups + g])), acc[r]);                          \
            }                                                                                          \
        }                                                                                              \
        for (int r = 0; r < R; r++) VSTORE(y + r * n + j0, acc[r]);                                    \
    }

typedef void (*ikernel_fn)(const int8_t *, const float *, const float *, const int32_t *, long, const uint8_t *,
                           float *, long, long);
I4_KERNEL(1) I4_KERNEL(2) I4_KERNEL(3) I4_KERNEL(4)
I8_KERNEL(1) I8_KERNEL(2) I8_KERNEL(3) I8_KERNEL(4)
#if RI > 4
I4_KERNEL(5) I4_KERNEL(6) I4_KERNEL(7) I4_KERNEL(8)
I8_KERNEL(5) I8_KERNEL(6) I8_KERNEL(7) I8_KERNEL(8)
static const ikernel_fn I_KERNELS[2][RI + 1] = {{0, i4_1, i4_2, i4_3, i4_4, i4_5, i4_6, i4_7, i4_8},
                                                {0, i8_1, i8_2, i8_3, i8_4, i8_5, i8_6, i8_7, i8_8}};
#else
static const ikernel_fn I_KERNELS[2][RI + 1] = {{0, i4_1, i4_2, i4_3, i4_4}, {0, i8_1, i8_2, i8_3, i8_4}};
#endif

/* ---- 8-bit-row products for Q4_0, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K (kinds 12 to 17) ----
 *
 * Every type is read as groups of 32 k-steps of unsigned quants q (4, 5 or 6 bits) and the group's
 * scales. Q4_0, Q5_0 and Q5_1 multiply rows in 8 bits quantized per 32 values as above: a group's
 * dot product with a column is one exact integer T, then y += (d s) T (+ m (s sum(a)) where the type
 * has a minimum), in k order group by group. The K-quants take rows quantized per block of 256, as
 * llama.cpp's Q8_K: the 8 groups' integers, each times its 6- or 8-bit scale, add up in int32 and
 * a block costs one float scaling a row instead of 8 (that scaling was about 30% of a Q4_K group's
 * time at 4 rows): y += (d s) T + (-dmin s) M a block, in k order block by block. Either way a row's
 * bits do not depend on the rows beside it:
 *   Q4_0  w = d (q - 8)                T = sum(q a) - 8 sum(a)
 *   Q5_0  w = d (q - 16)               T = sum(q a) - 16 sum(a)
 *   Q5_1  w = d q + m                  T = sum(q a)
 *   Q4_K, Q5_K  w = d sc q - dmin mn   T = sum over the block's groups g: sc_g sum_g(q a),
 *                                      M = sum over g: mn_g sum_g(a) (sc, mn: 6-bit integers)
 *   Q6_K  w = d sc_h (q - 32)          T = sum over the block's halves h of 16: sc_h (sum_h(q a) -
 *                                      32 sum_h(a)), sc_h the half's signed 8-bit scale.
 * A row feeding products of both kinds (a layer of a Q4_K_M file mixes Q5_0 or Q8_0 with Q4_K and
 * Q6_K) is quantized both ways (`own_rows`): a few thousand numbers.
 *
 * Packed per vector of LANES columns, group by group of 32 k-steps, each field LANES columns wide:
 *   Q4_0: d (float16)                  Q4_K: sc, mn (unsigned bytes)
 *   Q5_0: d (float16), H               Q5_K: sc, mn (unsigned bytes), H
 *   Q5_1: d, m (float16), H            Q6_K: sc_lo, sc_hi (signed bytes), H0, H1
 * then the quants' low 4 bits in four runs as Q4_1's above (run u: k = 4u + b in the low nibbles of a
 * column's 4 bytes, 16 + 4u + b in the high). H, a column's 4 bytes: bit u of byte b is q's 5th bit
 * at k = 4u + b, bit 4 + u at k = 16 + 4u + b. H0 and H1: bits 2u and 2u + 1 of byte b are q's 5th
 * and 6th bits at k = 4u + b (H0) and at k = 16 + 4u + b (H1). The K-quants' 8 groups of a block of
 * 256 come after its header: d and -dmin (Q6_K: d), float16, as the file stores them (dmin's sign
 * flipped, exact), so d sc and -dmin mn are formed in the kernel, each one exact multiply: the same
 * float32 values as formed ahead, in the file's bytes. Every type takes the file's bytes, or (Q4_K,
 * Q5_K) 4 more a block of 256: a step streams no more than the file holds. */
enum { X_Q4_0, X_Q5_0, X_Q5_1, X_Q4_K, X_Q5_K, X_Q6_K, X_TYPES };
#define X_FIRST 12 /* the kind number of X_Q4_0 */
static const int X_BYTES[X_TYPES] = {18, 22, 24, 18, 22, 26}; /* a column's bytes a group of 32 */
static const int X_HEADER[X_TYPES] = {0, 0, 0, 4, 4, 2};    /* a column's bytes ahead of 8 groups (K-quants) */
/* Bytes of one vector of columns of a weight k / 32 = `groups` groups deep (kind 2 Q4_1, 3 Q8_0,
 * 12 to 17 `X_TYPES`). */
static inline long vector_bytes(int kind, long groups) {
    if (kind < X_FIRST) return groups * LANES * (kind == 2 ? 20 : 34);
    int type = kind - X_FIRST;
    return (groups * X_BYTES[type] + groups / 8 * X_HEADER[type]) * LANES;
}

#if LANES == 16
#define X_VNNI 1
#define XBCAST(p) _mm512_set1_epi32(*(const int32_t *)(p))
#define XSET(v) _mm512_set1_epi32(v)
#define XAND(a, b) _mm512_and_si512(a, b)
#define XOR(a, b) _mm512_or_si512(a, b)
#define XADD(a, b) _mm512_add_epi32(a, b)
#define XSUB(a, b) _mm512_sub_epi32(a, b)
#define XSLLI(v, n) _mm512_slli_epi32(v, n)
#define XSRLI(v, n) _mm512_srli_epi32(v, n)
#define XMADD(a, b) _mm512_madd_epi16(a, b)
#define XMUL(a, b) _mm512_mullo_epi32(a, b)
#define XDOT(acc, q, p) _mm512_dpbusd_epi32(acc, q, XBCAST(p))
#else
#define XBCAST(p) _mm256_set1_epi32(*(const int32_t *)(p))
#define XSET(v) _mm256_set1_epi32(v)
#define XAND(a, b) _mm256_and_si256(a, b)
#define XOR(a, b) _mm256_or_si256(a, b)
#define XADD(a, b) _mm256_add_epi32(a, b)
#define XSUB(a, b) _mm256_sub_epi32(a, b)
#define XSLLI(v, n) _mm256_slli_epi32(v, n)
#define XSRLI(v, n) _mm256_srli_epi32(v, n)
#define XMADD(a, b) _mm256_madd_epi16(a, b)
#define XMUL(a, b) _mm256_mullo_epi32(a, b)
#if defined(__AVXVNNI__)
#define X_VNNI 1
#define XDOT(acc, q, p) _mm256_dpbusd_avx_epi32(acc, q, XBCAST(p))
#else
#define X_VNNI 0
#endif
#endif
/* Lanes of int16 pairs (lo, hi) from lanes of int32 lo and hi, each within int16. */
#define XPAIRS(lo, hi) XOR(XAND(lo, XSET(0xFFFF)), XSLLI(hi, 16))

/* T before its offset: q (8 runs of 4 k-steps, k = 4i .. 4i + 3 in q[i]) times a row's group a,
 * times the group's scale for the K-quants (lo: Q4_K's and Q5_K's sc, Q6_K's first half's; hi: Q6_K's
 * second half's; int32 lanes). With VNNI, dpbusd sums 4 byte products into 32 bits, then multiplied
 * by the scale. Without it, maddubs sums pairs of products into 16 bits, and `span` runs add up
 * there while they cannot pass 2^15 (|a| <= 127: 8 runs of 4-bit quants, 4 of 5-bit, 2 of 6-bit)
 * before madd widens them, multiplying the pairs by 1 or by the scale: the same instruction count
 * either way. The same integers with or without VNNI. */
static inline __attribute__((always_inline)) ivec x_dot(const int type, const ivec *q, const int8_t *a, ivec lo,
                                                        ivec hi) {
    ivec t = IZERO();
#if X_VNNI
    if (type == X_Q6_K) {
        ivec first = IZERO(), second = IZERO();
        for (int i = 0; i < 4; i++) first = XDOT(first, q[i], a + 4 * i);
        for (int i = 4; i < 8; i++) second = XDOT(second, q[i], a + 4 * i);
        return XADD(XMUL(first, lo), XMUL(second, hi));
    }
    for (int i = 0; i < 8; i++) t = XDOT(t, q[i], a + 4 * i);
    if (type == X_Q4_K || type == X_Q5_K) t = XMUL(t, lo);
#else
    const int span = type == X_Q6_K ? 2 : type == X_Q4_0 || type == X_Q4_K ? 8 : 4;
    const int scaled = type == X_Q4_K || type == X_Q5_K || type == X_Q6_K;
    for (int i = 0; i < 8; i += span) {
        ivec pairs = _mm256_maddubs_epi16(q[i], XBCAST(a + 4 * i));
        for (int j = i + 1; j < i + span; j++)
            pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(q[j], XBCAST(a + 4 * j)));
        t = XADD(t, XMADD(pairs, !scaled ? _mm256_set1_epi16(1) : i < 4 || type != X_Q6_K ? XPAIRS(lo, lo) : XPAIRS(hi, hi)));
    }
#endif
    return t;
}

/* The 8 groups' mn of a K-quant block of 256 (from `first`, groups `size` bytes apart) as int16
 * pairs (mn of group 2j, of 2j + 1) in int32 lanes, for madd by a row's pairs of groups' sums. */
static inline __attribute__((always_inline)) void x_mins(const uint8_t *first, long size, ivec *pairs) {
    for (int j = 0; j < 4; j++)
        pairs[j] = XOR(QU8(first + 2 * j * size + LANES), XSLLI(QU8(first + (2 * j + 1) * size + LANES), 16));
}

/* A K-quant block's end for one row: y += (d s) T + (-dmin s) M, s the row's scale for the block, T
 * the block's integers sum(sc q a) (Q6_K: with its offset) and M = sum_g mn_g sum_g(a) (Q4_K, Q5_K)
 * from the mins' pairs (`x_mins`) and the row's pairs of groups' sums (`pairs`, 4 a block). Exact
 * integers to here: |T| < 2^31 (Q6_K's worst: 16 halves of 128 x 16 x 32 x 127), M < 2^22. */
static inline __attribute__((always_inline)) vec x_block_end(int minimum, vec acc, ivec t, vec d, vec mins, float s,
                                                             const ivec *mn, const int32_t *pairs) {
    acc = VFMA(QFLOAT(t), VMUL(d, VSET(s)), acc);
    if (minimum) {
        ivec m = XMADD(mn[0], XSET(pairs[0]));
        for (int j = 1; j < 4; j++) m = XADD(m, XMADD(mn[j], XSET(pairs[j])));
        acc = VFMA(QFLOAT(m), VMUL(mins, VSET(s)), acc);
    }
    return acc;
}

/* y[r][j0 ..] for R rows and one vector of columns packed as above: each group's quants decoded once
 * into 8 runs of bytes and multiplied into all R rows. The type and R are constants where it is
 * inlined (`X_KERNEL`), so the branches on them compile away. Rows in 8 bits (`own_rows`): a (R, k),
 * and for the types of groups of 32 their scales s and s sum(a) (sm) and sums (R, k / 32); for the
 * K-quants s a block of 256 (R, k / 256), `sums` the pairs of groups' sums (R, k / 64) and `halves`
 * (R, k / 32). */
static inline __attribute__((always_inline)) void x_kernel(const int type, const int R, const int8_t *a,
                                                           const float *s, const float *sm, const int32_t *sums,
                                                           const int32_t *halves, long k, const uint8_t *wb,
                                                           float *y, long n, long j0) {
    const long groups = k / QK, size = (long)X_BYTES[type] * LANES, header = (long)X_HEADER[type] * LANES;
    const int super = type == X_Q4_K || type == X_Q5_K || type == X_Q6_K; /* blocks of 256 with a header */
    const int fifth = type == X_Q5_0 || type == X_Q5_1 || type == X_Q5_K;
    const int minimum = type == X_Q5_1 || type == X_Q4_K || type == X_Q5_K;
    vec acc[RI], block_d = VZERO(), block_min = VZERO();
    ivec block_t[RI];
    const uint8_t *block = wb;
    for (int r = 0; r < R; r++) acc[r] = VZERO(), block_t[r] = IZERO();
    for (long g = 0; g < groups; g++, wb += size) {
        if (super && g % 8 == 0) { /* a block of 256's d and -dmin, for its 8 groups */
            block_d = VHALF(wb);
            if (minimum) block_min = VHALF(wb + LANES * 2);
            wb += header, block = wb;
            for (int r = 0; r < R; r++) block_t[r] = IZERO();
        }
        PREFETCH_GROUP(wb + IAHEAD * size, size);
        const uint8_t *low = wb + size - 16 * LANES;
        ivec q[8], lo = IZERO(), hi = IZERO();
        for (int u = 0; u < 4; u++) {
            ivec v = ILOAD(low + u * LANES * 4);
            q[u] = INIBBLE(v, 0), q[u + 4] = INIBBLE(v, 4);
        }
        if (fifth) { /* bit u of byte b to bit 4 of q[u]'s byte b, bit 4 + u to q[u + 4]'s */
            ivec h = ILOAD(low - LANES * 4), bit = XSET(0x10101010);
            for (int u = 0; u < 4; u++) {
                q[u] = XOR(q[u], XAND(XSLLI(h, 4 - u), bit));
                q[u + 4] = XOR(q[u + 4], XAND(XSRLI(h, u), bit));
            }
        }
        if (type == X_Q6_K) { /* bits 2u, 2u + 1 of byte b to bits 4, 5 of q[u]'s (H0) and q[u + 4]'s (H1) */
            ivec h0 = ILOAD(wb + LANES * 2), h1 = ILOAD(wb + LANES * 6), bits = XSET(0x30303030);
            for (int u = 0; u < 4; u++) {
                q[u] = XOR(q[u], XAND(u < 3 ? XSLLI(h0, 4 - 2 * u) : XSRLI(h0, 2), bits));
                q[u + 4] = XOR(q[u + 4], XAND(u < 3 ? XSLLI(h1, 4 - 2 * u) : XSRLI(h1, 2), bits));
            }
            lo = QS8(wb), hi = QS8(wb + LANES);
        } else if (super)
            lo = QU8(wb); /* sc */
        vec d = VZERO(), mins = VZERO();
        if (!super) d = VHALF(wb);
        if (minimum && !super) mins = VHALF(wb + LANES * 2);
        _Pragma("GCC unroll 8") /* every row's accumulator kept in a register */
        for (int r = 0; r < R; r++) {
            long at = r * groups + g;
            ivec t = x_dot(type, q, a + r * k + g * QK, lo, hi);
            if (type == X_Q4_0 || type == X_Q5_0) t = XSUB(t, XSET((type == X_Q4_0 ? 8 : 16) * sums[at]));
            if (type == X_Q6_K) t = XSUB(t, XSLLI(XMADD(XPAIRS(lo, hi), XSET(halves[at])), 5));
            if (super) {
                block_t[r] = XADD(block_t[r], t);
                continue;
            }
            acc[r] = VFMA(QFLOAT(t), VMUL(d, VSET(s[at])), acc[r]);
            if (minimum) acc[r] = VFMA(mins, VSET(sm[at]), acc[r]);
        }
        if (super && g % 8 == 7) {
            ivec mn[4];
            if (minimum) x_mins(block, size, mn);
            for (int r = 0; r < R; r++)
                acc[r] = x_block_end(minimum, acc[r], block_t[r], block_d, block_min, s[r * (groups / 8) + g / 8], mn,
                                     sums + r * (groups / 2) + g / 2 - 3);
        }
    }
    for (int r = 0; r < R; r++) VSTORE(y + r * n + j0, acc[r]);
}

typedef void (*xkernel_fn)(const int8_t *, const float *, const float *, const int32_t *, const int32_t *, long,
                           const uint8_t *, float *, long, long);
#define X_KERNEL(TYPE, R)                                                                              \
    static void x_##TYPE##_##R(const int8_t *a, const float *s, const float *sm, const int32_t *sums,  \
                               const int32_t *halves, long k, const uint8_t *wb, float *y, long n, long j0) { \
        x_kernel(TYPE, R, a, s, sm, sums, halves, k, wb, y, n, j0);                                    \
    }
#if RI > 4
#define X_KERNELS(TYPE)                                                                                \
    X_KERNEL(TYPE, 1) X_KERNEL(TYPE, 2) X_KERNEL(TYPE, 3) X_KERNEL(TYPE, 4) X_KERNEL(TYPE, 5) X_KERNEL(TYPE, 6) \
    X_KERNEL(TYPE, 7) X_KERNEL(TYPE, 8)
#define X_NAMES(TYPE)                                                                                  \
    {0, x_##TYPE##_1, x_##TYPE##_2, x_##TYPE##_3, x_##TYPE##_4, x_##TYPE##_5, x_##TYPE##_6, x_##TYPE##_7, x_##TYPE##_8}
#else
#define X_KERNELS(TYPE) X_KERNEL(TYPE, 1) X_KERNEL(TYPE, 2) X_KERNEL(TYPE, 3) X_KERNEL(TYPE, 4)
#define X_NAMES(TYPE) {0, x_##TYPE##_1, x_##TYPE##_2, x_##TYPE##_3, x_##TYPE##_4}
#endif
X_KERNELS(X_Q4_0) X_KERNELS(X_Q5_0) X_KERNELS(X_Q5_1) X_KERNELS(X_Q4_K) X_KERNELS(X_Q5_K) X_KERNELS(X_Q6_K)
static const xkernel_fn X_KERNEL_TABLE[X_TYPES][RI + 1] = {X_NAMES(X_Q4_0), X_NAMES(X_Q5_0), X_NAMES(X_Q5_1),
                                                          X_NAMES(X_Q4_K), X_NAMES(X_Q5_K), X_NAMES(X_Q6_K)};
#if X_VNNI
#define RP RI /* `x_pair` is for builds without VNNI */
#else
#define RP 5 /* rows a pass of `x_pair` takes: 10 16-bit sums, 4 runs of quants and a broadcast in 16 registers */
#endif
#if !X_VNNI
/* Where a pass over two adjacent vectors of columns fetches ahead of w, a vector ending at `end`:
 * past its end, the vector after the other one, whose first groups the next pass reads. Running on
 * into the other vector, as one vector a pass does, fetched what is being read already and left the
 * next pass's second vector cold: a Q6_K product 2048 deep and 49152 wide, 4 rows from memory, took
 * 1.10 times as long on two vectors a pass as on one. */
static inline const uint8_t *x_ahead(const uint8_t *w, long ahead, const uint8_t *end, long stride) {
    return w + ahead < end ? w + ahead : w + ahead + stride;
}

/* Two vectors of columns at once, without VNNI. There a row's broadcast of
 * 4 activation bytes and the float scaling of each group cost about as much as the maddubs, so
 * `x_pair` shares each broadcast between 16 columns, run by run: a run of 4 k-steps is decoded for
 * both vectors, then each row's two broadcasts (k = 4u and 16 + 4u) go into both vectors' 16-bit
 * sums, widened (madd, by the K-quants' sc) after as many runs as `x_dot`'s span allows. So every
 * group's (K-quants: block's) T is `x_kernel`'s integer and the floats that follow are the same
 * operations in the same order: the same bits (Q4_K at 4 rows: about 0.75 of `x_kernel`'s time, docs/journal/2026-11-29-verify-four.md).
 * Q6_K's two halves would need twice the 16-bit sums, more than 16 registers hold: `x_pair6` takes
 * it half by half. `stride`: bytes from the first vector of columns to the second. */
static inline __attribute__((always_inline)) void x_pair(const int type, const int R, const int8_t *a,
                                                         const float *s, const float *sm, const int32_t *sums,
                                                         long k, const uint8_t *wb, long stride, float *y, long n,
                                                         long j0) {
    const long groups = k / QK, size = (long)X_BYTES[type] * LANES, header = (long)X_HEADER[type] * LANES;
    const int super = type == X_Q4_K || type == X_Q5_K;
    const int fifth = type == X_Q5_0 || type == X_Q5_1 || type == X_Q5_K;
    const int minimum = type == X_Q5_1 || type == X_Q4_K || type == X_Q5_K;
    const int runs = fifth ? 2 : 4; /* runs a 16-bit sum takes: `x_dot`'s span, two maddubs a run */
    vec acc[RP][2], block_d[2] = {VZERO(), VZERO()}, block_min[2] = {VZERO(), VZERO()};
    const uint8_t *w[2] = {wb, wb + stride};
    const int per = super ? 8 : 1; /* groups whose integers add up before the float scaling */
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = VZERO();
    for (long g = 0; g < groups; g += per) {
        const uint8_t *block[2];
        for (int c = 0; c < 2; c++) {
            if (super) {
                block_d[c] = VHALF(w[c]);
                block_min[c] = VHALF(w[c] + LANES * 2);
                w[c] += header;
            }
            block[c] = w[c];
        }
        ivec t[RP][2]; /* a group's integers, or (K-quants) a block's */
        for (int r = 0; r < R; r++) t[r][0] = t[r][1] = IZERO();
        for (int j = 0; j < per; j++) {
            ivec scales[2] = {_mm256_set1_epi16(1), _mm256_set1_epi16(1)};
            for (int c = 0; c < 2; c++) {
                PREFETCH_GROUP(x_ahead(w[c], IAHEAD * size, wb + (c + 1) * stride, stride), size);
                if (super) { /* the pairs summed into 16 bits times (sc, sc): sc T in the widening madd */
                    ivec sc = QU8(w[c]);
                    scales[c] = XPAIRS(sc, sc);
                }
            }
            ivec p[RP][2];
            for (int r = 0; r < R; r++) p[r][0] = p[r][1] = IZERO();
            _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) {
                ivec ql[2], qh[2];
                for (int c = 0; c < 2; c++) {
                    const uint8_t *low = w[c] + size - 16 * LANES;
                    ivec v = ILOAD(low + u * LANES * 4);
                    ql[c] = INIBBLE(v, 0), qh[c] = INIBBLE(v, 4);
                    if (fifth) { /* as in `x_kernel` */
                        ivec h = ILOAD(low - LANES * 4), bit = XSET(0x10101010);
                        ql[c] = XOR(ql[c], XAND(XSLLI(h, 4 - u), bit));
                        qh[c] = XOR(qh[c], XAND(XSRLI(h, u), bit));
                    }
                }
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                    const int8_t *ar = a + r * k + (g + j) * QK + 4 * u;
                    ivec b0 = XBCAST(ar), b1 = XBCAST(ar + 16);
                    /* each sum added to in turn (KEEP): left to itself the compiler keeps every
                     * product for a tree of adds at the end, more than 16 registers */
                    for (int c = 0; c < 2; c++) {
                        p[r][c] = _mm256_add_epi16(p[r][c], _mm256_maddubs_epi16(ql[c], b0));
                        KEEP(p[r][c]);
                    }
                    for (int c = 0; c < 2; c++) {
                        p[r][c] = _mm256_add_epi16(p[r][c], _mm256_maddubs_epi16(qh[c], b1));
                        KEEP(p[r][c]);
                    }
                }
                if ((u + 1) % runs == 0)
                    for (int r = 0; r < R; r++)
                        for (int c = 0; c < 2; c++)
                            t[r][c] = XADD(t[r][c], XMADD(p[r][c], scales[c])), p[r][c] = IZERO();
            }
            if (!super)
                for (int c = 0; c < 2; c++) {
                    vec d = VHALF(w[c]), mins = VZERO();
                    if (minimum) mins = VHALF(w[c] + LANES * 2);
                    for (int r = 0; r < R; r++) {
                        long at = r * groups + g;
                        ivec total = t[r][c];
                        if (type == X_Q4_0 || type == X_Q5_0)
                            total = XSUB(total, XSET((type == X_Q4_0 ? 8 : 16) * sums[at]));
                        acc[r][c] = VFMA(QFLOAT(total), VMUL(d, VSET(s[at])), acc[r][c]);
                        if (minimum) acc[r][c] = VFMA(mins, VSET(sm[at]), acc[r][c]);
                    }
                }
            w[0] += size, w[1] += size;
        }
        if (super) /* as in `x_kernel` */
            for (int c = 0; c < 2; c++) {
                ivec mn[4];
                x_mins(block[c], size, mn);
                for (int r = 0; r < R; r++)
                    acc[r][c] = x_block_end(1, acc[r][c], t[r][c], block_d[c], block_min[c], s[r * (groups / 8) + g / 8],
                                            mn, sums + r * (groups / 2) + g / 2);
            }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 2; c++) VSTORE(y + r * n + j0 + c * LANES, acc[r][c]);
}

/* `x_pair` for Q6_K: its two halves of 16 k-steps have scales of their own, so a group goes half by
 * half, each half's 4 runs into 2R 16-bit sums widened (madd by the half's sc) every 2 runs: only
 * 2R sums live, as for the other types. Each half's run u reads the low (first half) or high
 * nibbles of run u and bits 2u, 2u + 1 of H0 or H1, as `x_kernel` decodes them; the block's integers
 * and the float scaling are `x_kernel`'s: the same bits. */
static inline __attribute__((always_inline)) void x_pair6(const int R, const int8_t *a, const float *s,
                                                          const int32_t *halves, long k, const uint8_t *wb,
                                                          long stride, float *y, long n, long j0) {
    const long groups = k / QK, size = (long)X_BYTES[X_Q6_K] * LANES, header = (long)X_HEADER[X_Q6_K] * LANES;
    vec acc[RP][2], block_d[2];
    const uint8_t *w[2] = {wb, wb + stride};
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = VZERO();
    for (long g = 0; g < groups; g += 8) {
        for (int c = 0; c < 2; c++) block_d[c] = VHALF(w[c]), w[c] += header;
        ivec t[RP][2];
        for (int r = 0; r < R; r++) t[r][0] = t[r][1] = IZERO();
        for (int j = 0; j < 8; j++) {
            for (int c = 0; c < 2; c++) PREFETCH_GROUP(x_ahead(w[c], IAHEAD * size, wb + (c + 1) * stride, stride), size);
            _Pragma("GCC unroll 2") for (int half = 0; half < 2; half++) {
                ivec scales[2], p[RP][2];
                for (int c = 0; c < 2; c++) {
                    ivec sc = QS8(w[c] + half * LANES);
                    scales[c] = XPAIRS(sc, sc);
                }
                for (int r = 0; r < R; r++) p[r][0] = p[r][1] = IZERO();
                _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) {
                    ivec q[2];
                    for (int c = 0; c < 2; c++) {
                        ivec v = ILOAD(w[c] + size - 16 * LANES + u * LANES * 4);
                        ivec h = ILOAD(w[c] + LANES * (2 + 4 * half));
                        q[c] = XOR(INIBBLE(v, 4 * half), XAND(u < 3 ? XSLLI(h, 4 - 2 * u) : XSRLI(h, 2), XSET(0x30303030)));
                    }
                    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                        ivec b = XBCAST(a + r * k + (g + j) * QK + 16 * half + 4 * u);
                        for (int c = 0; c < 2; c++) {
                            p[r][c] = _mm256_add_epi16(p[r][c], _mm256_maddubs_epi16(q[c], b));
                            KEEP(p[r][c]);
                        }
                    }
                    if (u % 2 == 1) /* 2 runs of 6-bit quants: at most 2 x 2 x 63 x 127 < 2^15 */
                        for (int r = 0; r < R; r++)
                            for (int c = 0; c < 2; c++)
                                t[r][c] = XADD(t[r][c], XMADD(p[r][c], scales[c])), p[r][c] = IZERO();
                }
            }
            for (int c = 0; c < 2; c++) { /* the offset: -32 (sc_lo sum_lo(a) + sc_hi sum_hi(a)) */
                ivec offset = XPAIRS(QS8(w[c]), QS8(w[c] + LANES));
                for (int r = 0; r < R; r++)
                    t[r][c] = XSUB(t[r][c], XSLLI(XMADD(offset, XSET(halves[r * groups + g + j])), 5));
                w[c] += size;
            }
        }
        for (int c = 0; c < 2; c++)
            for (int r = 0; r < R; r++)
                acc[r][c] = x_block_end(0, acc[r][c], t[r][c], block_d[c], VZERO(), s[r * (groups / 8) + g / 8], 0, 0);
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 2; c++) VSTORE(y + r * n + j0 + c * LANES, acc[r][c]);
}

#define X_PAIR(TYPE, R)                                                                                \
    static void xp_##TYPE##_##R(const int8_t *a, const float *s, const float *sm, const int32_t *sums, \
                                const int32_t *halves, long k, const uint8_t *wb, long stride, float *y, long n, \
                                long j0) {                                                             \
        if (TYPE == X_Q6_K)                                                                            \
            x_pair6(R, a, s, halves, k, wb, stride, y, n, j0);                                         \
        else                                                                                           \
            x_pair(TYPE, R, a, s, sm, sums, k, wb, stride, y, n, j0);                                  \
    }
#define X_PAIRS(TYPE) X_PAIR(TYPE, 1) X_PAIR(TYPE, 2) X_PAIR(TYPE, 3) X_PAIR(TYPE, 4) X_PAIR(TYPE, 5)
#define X_PAIR_NAMES(TYPE) {0, xp_##TYPE##_1, xp_##TYPE##_2, xp_##TYPE##_3, xp_##TYPE##_4, xp_##TYPE##_5}
typedef void (*xpair_fn)(const int8_t *, const float *, const float *, const int32_t *, const int32_t *, long,
                         const uint8_t *, long, float *, long, long);
X_PAIRS(X_Q4_0) X_PAIRS(X_Q5_0) X_PAIRS(X_Q5_1) X_PAIRS(X_Q4_K) X_PAIRS(X_Q5_K) X_PAIRS(X_Q6_K)
static const xpair_fn X_PAIR_TABLE[X_TYPES][RP + 1] = {X_PAIR_NAMES(X_Q4_0), X_PAIR_NAMES(X_Q5_0),
                                                      X_PAIR_NAMES(X_Q5_1), X_PAIR_NAMES(X_Q4_K),
                                                      X_PAIR_NAMES(X_Q5_K), X_PAIR_NAMES(X_Q6_K)};
#endif
/* One column's group g (of 32 weights) of a row of `type` blocks at `row`: its quants q (0 to 63)
 * and its scale fields (`fields`, 1 or 2 of `field` bytes each: d (and m) float16, or the K-quants'
 * sc and mn, Q6_K's sc_lo and sc_hi, a byte each), as `block_groups.groups_of` reads them. */
static void x_group(int type, const uint8_t *row, long g, uint8_t *q, uint8_t fields[2][2]) {
    static const int size[X_TYPES] = {18, 22, 24, 144, 176, 210};
    if (type <= X_Q5_1) {
        const uint8_t *b = row + g * size[type];
        const uint8_t *qs = b + (type == X_Q4_0 ? 2 : type == X_Q5_0 ? 6 : 8);
        uint32_t qh = 0;
        if (type != X_Q4_0) memcpy(&qh, b + (type == X_Q5_0 ? 2 : 4), 4);
        for (int i = 0; i < 32; i++) q[i] = (uint8_t)(((i < 16 ? qs[i] : qs[i - 16] >> 4) & 15) | ((qh >> i) & 1) << 4);
        memcpy(fields[0], b, 2);
        if (type == X_Q5_1) memcpy(fields[1], b + 2, 2);
        return;
    }
    const uint8_t *b = row + g / 8 * size[type];
    long j = g % 8;
    if (type == X_Q6_K) {
        for (int i = 0; i < 32; i++) {
            long f = j * 32 + i, h = f / 128;
            uint8_t low = (uint8_t)(b[h * 64 + f % 64] >> (4 * (f % 128 / 64)) & 15);
            uint8_t high = (uint8_t)(b[128 + h * 32 + f % 32] >> (2 * (f % 128 / 32)) & 3);
            q[i] = (uint8_t)(low | high << 4);
        }
        fields[0][0] = b[192 + 2 * j], fields[1][0] = b[193 + 2 * j];
        return;
    }
    const uint8_t *scales = b + 4, *qs = b + (type == X_Q4_K ? 16 : 48);
    for (int i = 0; i < 32; i++) {
        q[i] = (uint8_t)(qs[j / 2 * 32 + i] >> (4 * (j % 2)) & 15);
        if (type == X_Q5_K) q[i] |= (uint8_t)((b[16 + i] >> j & 1) << 4);
    }
    /* llama.cpp's get_scale_min_k4 */
    fields[0][0] = (uint8_t)(j < 4 ? scales[j] & 63 : (scales[j + 4] & 15) | (scales[j - 4] >> 6) << 4);
    fields[1][0] = (uint8_t)(j < 4 ? scales[j + 4] & 63 : (scales[j + 4] >> 4) | (scales[j] >> 6) << 4);
}

/* Bytes `row_kernel_lay_out` writes for `vectors` vectors of columns `groups` groups of 32 deep. */
long row_kernel_laid_bytes(int kind, long vectors, long groups) { return vectors * vector_bytes(kind, groups); }

/* Rows of GGUF blocks of kind 12 to 17 (`vectors` LANES rows each, `groups` groups of 32 deep, each
 * row `row_bytes` long) into the layout above, at out: `block_groups.layout`'s bytes, without its
 * scratch of a byte a weight. */
void row_kernel_lay_out(int kind, const uint8_t *rows, long vectors, long groups, long row_bytes, uint8_t *out) {
    const int type = kind - X_FIRST, super = type >= X_Q4_K;
    const int count = type == X_Q5_1 || super ? 2 : 1, width = super ? 1 : 2;
    const int high = type == X_Q5_0 || type == X_Q5_1 || type == X_Q5_K ? 1 : type == X_Q6_K ? 2 : 0;
    static const int header[X_TYPES] = {0, 0, 0, 2, 2, 1}; /* float16 fields ahead of a K-quant block */
    for (long v = 0; v < vectors; v++) {
        const uint8_t *first = rows + v * LANES * row_bytes;
        for (long g = 0; g < groups; g++) {
            if (super && g % 8 == 0)
                for (int f = 0; f < header[type]; f++)
                    for (int lane = 0; lane < LANES; lane++, out += 2) {
                        const uint8_t *b = first + lane * row_bytes + g / 8 * (type == X_Q6_K ? 210 : type == X_Q4_K ? 144 : 176);
                        memcpy(out, type == X_Q6_K ? b + 208 : b + 2 * f, 2);
                        if (f == 1) out[1] ^= 0x80; /* -dmin: the sign bit flipped */
                    }
            uint8_t q[LANES][32], fields[LANES][2][2];
            for (int lane = 0; lane < LANES; lane++) x_group(type, first + lane * row_bytes, g, q[lane], fields[lane]);
            for (int f = 0; f < count; f++)
                for (int lane = 0; lane < LANES; lane++, out += width) memcpy(out, fields[lane][f], width);
            for (int word = 0; word < high; word++) /* H (Q5), or H0 then H1 (Q6_K) */
                for (int lane = 0; lane < LANES; lane++)
                    for (int byte = 0; byte < 4; byte++, out++) {
                        uint8_t h = 0;
                        for (int u = 0; u < 4; u++) {
                            if (high == 1)
                                h |= (uint8_t)((q[lane][4 * u + byte] >> 4) << u | (q[lane][16 + 4 * u + byte] >> 4) << (u + 4));
                            else
                                h |= (uint8_t)((q[lane][16 * word + 4 * u + byte] >> 4) << (2 * u));
                        }
                        *out = h;
                    }
            for (int u = 0; u < 4; u++) /* the low 4 bits: run u, each column's bytes 4u .. 4u + 3 */
                for (int lane = 0; lane < LANES; lane++)
                    for (int byte = 0; byte < 4; byte++, out++)
                        *out = (uint8_t)((q[lane][4 * u + byte] & 15) | (q[lane][16 + 4 * u + byte] & 15) << 4);
        }
    }
}
/* ---- end of the 8-bit-row products for Q4_0 .. Q6_K ---- */

/* A thread's own copy of the rows in 8 bits (every thread quantizes all rows: a few thousand
 * numbers, cheaper than a barrier), grown as needed and kept for the thread's next call: [0] in
 * spans of 32 (the types of groups of 32, Q4_1, Q8_0), [1] in spans of 256 (the K-quants, as
 * llama.cpp's Q8_K: one float scaling a block of 256 a row instead of 8). A row feeding both kinds
 * (a layer of a Q4_K_M file mixes Q5_0 or Q8_0 with Q4_K and Q6_K) gets both. */
struct own_rows_of {
    int8_t *a;
    float *s, *sm;             /* s (m, k / span); sm = s sum(a) (m, k / 32): spans of 32 only */
    int32_t *sums, *halves;    /* (m, k / 32) each (`quantize_rows`) */
    int32_t *pairs;            /* spans of 256: the groups' sums 2j, 2j + 1 as int16 pairs (m, k / 64) */
    long room;
};
static _Thread_local struct own_rows_of own[2];

/* 1 for the kinds whose rows go in spans of 256 (Q4_K, Q5_K, Q6_K), else 0: `own`'s index. */
static inline int k_rows(int64_t kind) { return kind >= X_FIRST + X_Q4_K && kind <= X_FIRST + X_Q6_K; }

/* This thread's rows x (m, k) in 8 bits, in its own copy (`own`): `need` bit 0 in spans of 32, bit 1
 * in spans of 256. */
static void own_rows(const float *x, long m, long k, int need) {
    long groups = k / QK;
    for (int i = 0; i < 2; i++) {
        struct own_rows_of *o = &own[i];
        if (!(need >> i & 1)) continue;
        if (o->room < m * k) {
            free(o->a), free(o->s), free(o->sums);
            o->a = malloc(m * k), o->s = malloc(sizeof(float) * 2 * m * groups);
            o->sums = malloc(sizeof(int32_t) * 3 * m * groups), o->room = m * k;
            o->sm = o->s + m * groups, o->halves = o->sums + m * groups, o->pairs = o->halves + m * groups;
        }
        quantize_rows(x, m, k, i ? 256 : QK, o->a, o->s, o->sums, o->halves);
        if (i)
            for (long j = 0; j < m * groups / 2; j++)
                o->pairs[j] = (int32_t)(((uint32_t)o->sums[2 * j + 1] << 16) | ((uint32_t)o->sums[2 * j] & 0xFFFFu));
        else
            for (long j = 0; j < m * groups; j++) o->sm[j] = o->s[j] * (float)o->sums[j];
    }
}

/* Vectors of columns [first, last) of y (m, n) = x (m, k) w^T for w packed as above (kind 2: Q4_1,
 * 3: Q8_0, 12 to 17: Q4_0 to Q6_K), from this thread's rows in 8 bits (`own_rows`). */
static void int8_vectors(int kind, long m, long k, const uint8_t *w, long n, float *y, long first, long last) {
    long groups = k / QK, bytes = vector_bytes(kind, groups);
    const int kx = k_rows(kind);
    const struct own_rows_of *rows8 = &own[kx];
    /* the rows a pass takes: at most RI (x_pair: RP), shared evenly (m = 6: 3 + 3, not 4 + 2), the
     * first `extra[p]` passes one more than `base[p]`; worked out once here, not in the loop below,
     * where its divisions cost a one-row product several percent */
    long base[2], extra[2], passes[2];
    for (int p = 0; p < 2; p++) {
        long most = p ? RP : RI;
        passes[p] = (m + most - 1) / most, base[p] = m / passes[p], extra[p] = m % passes[p];
    }
    for (long v = first; v < last; v++) {
        const uint8_t *wb = w + v * bytes;
        /* `x_pair` for verifies: a step's one row is bound by streaming the weights from memory on
         * two threads (x_pair gained nothing clear there, and its bits are x_kernel's anyway) */
        int pair = !X_VNNI && m > 1 && kind >= X_FIRST && v + 1 < last;
        for (long r = 0, pass = 0, rows; r < m; r += rows, pass++) {
            rows = base[pair] + (pass < extra[pair]);
            const int8_t *a = rows8->a + r * k;
            const float *s = rows8->s + r * (kx ? groups / 8 : groups), *sm = rows8->sm + r * groups;
            const int32_t *sums = kx ? rows8->pairs + r * (groups / 2) : rows8->sums + r * groups;
            const int32_t *halves = rows8->halves + r * groups;
#if !X_VNNI
            if (pair)
                X_PAIR_TABLE[kind - X_FIRST][rows](a, s, sm, sums, halves, k, wb, bytes, y + r * n, n, v * LANES);
            else
#endif
            if (kind >= X_FIRST)
                X_KERNEL_TABLE[kind - X_FIRST][rows](a, s, sm, sums, halves, k, wb, y + r * n, n, v * LANES);
            else
                I_KERNELS[kind - 2][rows](a, s, sm, sums, k, wb, y + r * n, n, v * LANES);
        }
        v += pair;
    }
}

/* y (m, n) = x (m, k) w^T for w packed as above, the vectors of columns split between threads in
 * contiguous runs. */
static void int8_part(int t, int nt, int kind, const float *x, long m, long k, const uint8_t *w, long n, float *y) {
    long vectors = n / LANES;
    own_rows(x, m, k, 1 << k_rows(kind));
    int8_vectors(kind, m, k, w, n, y, vectors * t / nt, vectors * (t + 1) / nt);
}
#endif

/* e^x lane by lane: x = n ln 2 + r with |r| <= ln 2 / 2, e^r by its Taylor series to r^7 (relative
 * error about 5e-9), times 2^n; exactly 0 below -87 (where float32's normal range ends). */
static inline vec vexp(vec x) {
    const vec floor = VSET(-87.0f);
    vec t = VMAX(x, floor);
    vec n = VROUND(VMUL(t, VSET(1.44269504088896341f)));
    vec r = VFNMA(n, VSET(0.693359375f), t);
    r = VFNMA(n, VSET(-2.12194440e-4f), r);
    vec p = VSET(1.0f / 5040);
    p = VFMA(p, r, VSET(1.0f / 720));
    p = VFMA(p, r, VSET(1.0f / 120));
    p = VFMA(p, r, VSET(1.0f / 24));
    p = VFMA(p, r, VSET(1.0f / 6));
    p = VFMA(p, r, VSET(0.5f));
    p = VFMA(p, r, VSET(1.0f));
    p = VFMA(p, r, VSET(1.0f));
    return VZERO_BELOW(VMUL(p, VPOW2(n)), x, floor);
}

#define QMAX 4 /* query heads that share a pass over their key/value head's slots */
#define VMAXV 16 /* vectors of a head: d at most 256 */

/* Scores, softmax and weighted values of QN query heads (at most QMAX) over the same `count` slots of
 * one key/value head (keys k and values v at d = V LANES floats a slot, V at most VMAXV): the
 * group's heads read each slot's key and value from L1 after the first. Each head's arithmetic is
 * what a call for it alone does, in the same order: a score is V fused multiply-adds and a lane sum
 * (LANES slots' sums at once, `fold`, each in an order of its own lanes only), the softmax's total
 * is taken in slot order, and a value's weighted sum runs slot by slot. `scores` holds QN `padded`
 * floats; q[i] and out[i] are head i's query and output. Inlined where QN and V are constants
 * (`ATTEND`), the compiler unrolls it and keeps the queries, dots and sums in registers;
 * `attend_any` takes them at run time, the same operations in the same order. */
static inline __attribute__((always_inline)) void attend(int QN, int V, const float *const *q, const float *k,
                                                         const float *v, long count, float scale, float *scores,
                                                         long padded, float *const *out) {
    vec qv[QMAX][VMAXV], total[QMAX], acc[QMAX][VMAXV], tops[QMAX];
    float top[QMAX];
    for (int i = 0; i < QN; i++) {
        for (int c = 0; c < V; c++) qv[i][c] = VLOAD(q[i] + c * LANES);
        tops[i] = VSET(-INFINITY);
    }
    for (long j0 = 0; j0 < count; j0 += LANES) {
        int n = count - j0 < LANES ? (int)(count - j0) : LANES;
        for (int i = 0; i < QN; i++) {
            vec dots[LANES]; /* unrolled, so that the dots stay in registers for the fold */
            _Pragma("GCC unroll 16") for (int l = 0; l < LANES; l++) {
                const float *kj = k + (j0 + l) * V * LANES;
                vec dot = VZERO();
                if (l < n) {
                    dot = VMUL(qv[i][0], VLOAD(kj));
                    for (int c = 1; c < V; c++) dot = VFMA(qv[i][c], VLOAD(kj + c * LANES), dot);
                }
                dots[FOLDED(l)] = dot;
            }
            vec sc = VTAIL(VMUL(fold(dots), VSET(scale)), n);
            VSTORE(scores + i * padded + j0, sc);
            tops[i] = VMAX(tops[i], sc);
        }
    }
    for (int i = 0; i < QN; i++) top[i] = vtop(tops[i]);
    for (int i = 0; i < QN; i++) {
        float *si = scores + i * padded;
        for (long j = count; j < padded; j++) si[j] = -INFINITY;
        vec peak = VSET(top[i]);
        total[i] = VZERO();
        for (long j = 0; j < padded; j += LANES) {
            vec e = vexp(VSUB(VLOAD(si + j), peak));
            VSTORE(si + j, e);
            total[i] = VADD(total[i], e);
        }
        for (int c = 0; c < V; c++) acc[i][c] = VZERO();
    }
    for (long j = 0; j < count; j++) {
        vec vv[VMAXV];
        for (int c = 0; c < V; c++) {
            vv[c] = VLOAD(v + (j * V + c) * LANES);
            KEEP(vv[c]); /* loaded once for the group's heads, not once a head */
        }
        for (int i = 0; i < QN; i++) {
            vec p = VBCAST(scores + i * padded + j);
            for (int c = 0; c < V; c++) acc[i][c] = VFMA(p, vv[c], acc[i][c]);
        }
    }
    for (int i = 0; i < QN; i++) {
        vec inverse = VSET(1.0f / vsum(total[i]));
        for (int c = 0; c < V; c++) VSTORE(out[i] + c * LANES, VMUL(acc[i][c], inverse));
    }
}

#define ATTEND(QN, V)                                                                                  \
    static void attend_##QN##_##V(const float *const *q, const float *k, const float *v, long count,    \
                                  float scale, float *scores, long padded, float *const *out) {        \
        attend(QN, V, q, k, v, count, scale, scores, padded, out);                                     \
    }
static void attend_any(int QN, int V, const float *const *q, const float *k, const float *v, long count, float scale,
                       float *scores, long padded, float *const *out) {
    attend(QN, V, q, k, v, count, scale, scores, padded, out);
}

#define ATTEND_HEADS(V) ATTEND(1, V) ATTEND(2, V) ATTEND(3, V) ATTEND(4, V)
#define ATTEND_NAMES(V) {0, attend_1_##V, attend_2_##V, attend_3_##V, attend_4_##V}
typedef void (*attend_fn)(const float *const *, const float *, const float *, long, float, float *, long,
                          float *const *);
#define NO_NAMES {0, 0, 0, 0, 0}
/* Unrolled for the common head sizes, 64 and 128 (each of the 64 variants costs the compiler about
 * as much as the rest of this file); any other size takes `attend_any`, the same sums in the same
 * order with the counts known only at run time. */
#if LANES == 16
ATTEND_HEADS(4) ATTEND_HEADS(8)
static const attend_fn ATTENDS[VMAXV][QMAX + 1] = {NO_NAMES, NO_NAMES, NO_NAMES, ATTEND_NAMES(4),
                                                  NO_NAMES, NO_NAMES, NO_NAMES, ATTEND_NAMES(8)};
#else
ATTEND_HEADS(8) ATTEND_HEADS(16)
static const attend_fn ATTENDS[VMAXV][QMAX + 1] = {NO_NAMES, NO_NAMES, NO_NAMES, NO_NAMES, NO_NAMES, NO_NAMES,
                                                  NO_NAMES, ATTEND_NAMES(8), [15] = ATTEND_NAMES(16)};
#endif

static _Thread_local float *own_scores;
static _Thread_local long own_scores_room;

/* Attention of m query rows after cached keys and values, each row over its own slots only: row r
 * attends to slots [lo, ends[r]) (lo = ends[r] - window where a window applies, else 0) of its
 * key/value head (query heads share them in equal groups). Every sum runs in slot order, or lane by
 * lane then in a fixed order, and a row reads nothing of the other rows: its bits are those of a
 * call of its own, at any m, and do not depend on which heads share a pass (`ATTEND`).
 *
 * q (m, heads, d) at strides q_row, q_head (floats); keys and values (kv_heads, capacity, d) at
 * kv_head floats between heads; out (m, heads, d) contiguous; d a multiple of LANES, at most 256. The
 * work is split in items of a row and up to QMAX heads of a group, fewer a pass where there would
 * be under two items a thread. */
static void attention_part(int t, int nt, const float *q, long q_row, long q_head, const float *keys,
                           const float *values, long kv_head, const int64_t *ends, long m, long heads, long kv_heads,
                           long d, long window, float scale, float *out) {
    long group = heads / kv_heads, vectors = d / LANES;
    long pass = group < QMAX ? group : QMAX;
    if (m * kv_heads * ((group + pass - 1) / pass) < 2 * nt && pass > 1) pass = (pass + 1) / 2;
    long parts = (group + pass - 1) / pass, items = m * kv_heads * parts;
    for (long item = items * t / nt; item < items * (t + 1) / nt; item++) {
        /* rows vary fastest: a thread's items read the same key/value head's slots one after another,
         * from L2 after the first (a row at a time, the slots of every head went through the cache
         * again for each row) */
        long r = item % m, g = item / m / parts, first = g * group + item / m % parts * pass;
        long count_heads = first + pass <= (g + 1) * group ? pass : (g + 1) * group - first;
        long end = ends[r], lo = window > 0 && end > window ? end - window : 0, count = end - lo;
        long padded = (count + LANES - 1) / LANES * LANES;
        if (padded < LANES) padded = LANES;
        if (own_scores_room < count_heads * padded) {
            free(own_scores);
            own_scores_room = count_heads * padded * 2;
            own_scores = malloc(sizeof(float) * own_scores_room);
        }
        const float *qs[QMAX];
        float *outs[QMAX];
        for (long i = 0; i < count_heads; i++) {
            qs[i] = q + r * q_row + (first + i) * q_head;
            outs[i] = out + (r * heads + first + i) * d;
        }
        const float *k = keys + g * kv_head + lo * d, *v = values + g * kv_head + lo * d;
        attend_fn unrolled = ATTENDS[vectors - 1][count_heads];
        if (unrolled)
            unrolled(qs, k, v, count, scale, own_scores, padded, outs);
        else
            attend_any((int)count_heads, (int)vectors, qs, k, v, count, scale, own_scores, padded, outs);
    }
}

void row_kernel_attention(const float *q, long q_row, long q_head, const float *keys, const float *values,
                          long kv_head, const int64_t *ends, long m, long heads, long kv_heads, long d, long window,
                          float scale, float *out, int threads) {
#pragma omp parallel num_threads(threads)
    attention_part(omp_get_thread_num(), omp_get_num_threads(), q, q_row, q_head, keys, values, kv_head, ends, m,
                   heads, kv_heads, d, window, scale, out);
}

/* Whether products of `kind` take their rows in 8 bits: 2 Q4_1, 3 Q8_0, 12 to 17 Q4_0 to Q6_K. */
static inline int int8_kind(int64_t kind) { return kind == 2 || kind == 3 || (kind >= 12 && kind <= 17); }

/* A product inside a team of threads: kind -1 float32 blocks; 0 Q4_1, 1 Q8_0 and 4 to 9 the other
 * block types (`CODE_TYPES`) with float32 rows; the kinds of `int8_kind` with 8-bit rows (the
 * layouts above). */
static void any_part(int t, int nt, int64_t kind, const void *w, const float *x, long m, long k, long n, float *y) {
    if (kind < 0)
        product_part(t, nt, x, m, k, (const float *)w, n, y);
    else if (kind >= CODE_KINDS && kind <= CODE_LAST)
        codes_part(t, nt, (int)kind, x, m, k, (const uint8_t *)w, n, y);
#if INT8_ACTIVATIONS
    else if (int8_kind(kind))
        int8_part(t, nt, (int)kind, x, m, k, (const uint8_t *)w, n, y);
#endif
    else
        quantized_part(t, nt, (int)kind, x, m, k, (const uint8_t *)w, n, y);
}

/* y (m, n) = x (m, k) w^T on a GGUF weight packed as above (`kind` as in `any_part`). */
void row_kernel_quantized(int kind, const float *x, long m, long k, const uint8_t *w, long n, float *y, int threads) {
#pragma omp parallel num_threads(threads)
    any_part(omp_get_thread_num(), omp_get_num_threads(), kind, w, x, m, k, n, y);
}

/* x / sqrt(mean(x^2) + eps) * weight, row by row: the sum of squares in index order. */
static void rms_rows(const float *x, long m, long width, const float *weight, float eps, float *out) {
    for (long r = 0; r < m; r++) {
        const float *xr = x + r * width;
        float sum = 0.0f;
        for (long j = 0; j < width; j++) sum += xr[j] * xr[j];
        float inverse = 1.0f / sqrtf(sum / (float)width + eps);
        for (long j = 0; j < width; j++) out[r * width + j] = weight[j] * (xr[j] * inverse);
    }
}

/* One head's d values of a row turned by the rotary (cos and sin the row's, sin carrying
 * rotate_half's sign) into `into`, which may be where they are. */
static inline void rotate(const float *v, const float *c, const float *s, long d, float *into) {
    long half = d / 2;
    float turned[256];
    for (long j = 0; j < d; j++) {
        float a = v[j] * c[j], b = v[j < half ? j + half : j - half] * s[j];
        turned[j] = a + b;
    }
    for (long j = 0; j < d; j++) into[j] = turned[j];
}

/* Head unit u (a query head, then the key heads, then the value heads) of row r of the
 * query/key/value product (rows n_qkv wide): a query turned by the rotary where it is, a key turned
 * into the layer's cache (lk), a value copied into it (lv), at position start + r. */
static inline void place(float *qkv, long n_qkv, long r, long u, const float *cos, const float *sin, float *lk,
                         float *lv, long kv_stride, long start, long heads, long kv_heads, long d) {
    const float *c = cos + r * d, *s = sin + r * d;
    float *v = qkv + r * n_qkv + u * d;
    if (u < heads)
        rotate(v, c, s, d, v);
    else if (u < heads + kv_heads)
        rotate(v, c, s, d, lk + (u - heads) * kv_stride + (start + r) * d);
    else
        for (long j = 0; j < d; j++) lv[(u - heads - kv_heads) * kv_stride + (start + r) * d + j] = v[j];
}

/* silu(gate) * up for columns [first, last) of m rows: gate and up (m, 2 inter) side by side, into
 * act (m, inter); gate = e / (1 + e^-g), a vector of LANES columns at a time, one by one after the
 * last whole vector of the row. */
static void silu_columns(const float *gu, long m, long inter, long first, long last, float *act) {
    for (long r = 0; r < m; r++) {
        const float *g = gu + r * 2 * inter, *u = g + inter;
        float *a = act + r * inter;
        long j = first;
        for (; j + LANES <= last; j += LANES) {
            vec gv = VLOAD(g + j);
            vec e = vexp(VSUB(VZERO(), gv));
            VSTORE(a + j, VMUL(VDIV(gv, VADD(VSET(1.0f), e)), VLOAD(u + j)));
        }
        for (; j < last; j++) a[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
    }
}

/* A thread's own copy of the residual stream and of a norm's output, m rows each, kept between calls. */
static _Thread_local float *own_x;
static _Thread_local long own_x_room;

/* Llama decoder layers for m new positions start, start + 1, ... of one sequence, after `start`
 * cached ones, in one team of threads: the residual stream x (m, hidden) goes through `layers`
 * layers and is updated in place; each layer's keys and values for the positions go to its cache
 * (layer i's at keys + i layer_stride, (kv_heads, capacity, d), kv_stride floats between heads).
 * Per layer (arrays of 2 or 6 entries a layer): the norms' weights, and the products (kinds,
 * weights, widths) for query/key/value in up to 3 parts (a Q4_K_M file's Q4_K queries and keys and
 * Q6_K values, say; width 0 where a layer has fewer: parts other than the first only with 8-bit
 * rows, each a whole number of heads wide), out, gate_up and down; windows (0: none). cos and sin (m, d) are the
 * rotary's (sin carrying rotate_half's sign). After each layer in taps (counted from 1), the residual
 * stream goes to tapped (m, n_taps, hidden). scratch holds m (qkv width + heads d + hidden + 3
 * gate_up width / 2) floats.
 *
 * Every step is row by row or, for the products and attention, the same code as the calls above: a
 * row's bits do not depend on m. Each thread keeps the residual stream and the norms' outputs
 * itself (a few thousand numbers, cheaper than waiting for each other), so a layer waits for the
 * other threads five times: after the query/key/value product (on 8-bit rows each thread turns
 * and caches the heads it computed), after attention, after the output product, after gate/up (on
 * 8-bit rows each thread applies SiLU to the columns it computed) and after down. */
void row_kernel_layers(float *x, long m, long hidden, long layers, const float *const *norms, float eps,
                       const int64_t *kinds, const void *const *weights, const int64_t *widths, const float *cos,
                       const float *sin, float *keys, float *values, long layer_stride, long kv_stride, long start,
                       long heads, long kv_heads, long d, const int64_t *windows, float scale, const int64_t *taps,
                       long n_taps, float *tapped, float *scratch, int threads) {
    int64_t ends[64];
    for (long r = 0; r < m && r < 64; r++) ends[r] = start + r + 1;
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        if (own_x_room < 2 * m * hidden) {
            free(own_x);
            own_x = malloc(sizeof(float) * 2 * m * hidden), own_x_room = 2 * m * hidden;
        }
        float *xp = own_x, *h = own_x + m * hidden;
        for (long i = 0; i < m * hidden; i++) xp[i] = x[i];
        long units = heads + 2 * kv_heads, per = d / LANES, tap = 0;
        for (long layer = 0; layer < layers; layer++) {
            const int64_t *kind = kinds + 6 * layer, *width = widths + 6 * layer;
            const void *const *w = weights + 6 * layer;
            long n_qkv = width[0] + width[1] + width[2], n_gu = width[4], inter = n_gu / 2;
            float *qkv = scratch, *att = qkv + m * n_qkv, *y = att + m * heads * d, *gu = y + m * hidden;
            float *act = gu + m * n_gu, *lk = keys + layer * layer_stride, *lv = values + layer * layer_stride;
            for (long r = 0; r < m; r++)
                rms_rows(xp + r * hidden, 1, hidden, norms[2 * layer], eps, h + r * hidden);
            /* queries, keys and values; the rotary; keys and values into the cache (`place`) */
#if INT8_ACTIVATIONS
            if (int8_kind(kind[0])) { /* each thread its own heads, turned and cached as soon as computed */
                int need = 0;
                for (int part = 0; part < 3; part++)
                    if (width[part]) need |= 1 << k_rows(kind[part]);
                own_rows(h, m, hidden, need);
                for (long u = units * t / nt; u < units * (t + 1) / nt; u++) {
                    int part = 0; /* the part holding unit u's columns, from column `first` on */
                    long first = 0;
                    while (u * d >= first + width[part]) first += width[part++];
                    int8_vectors((int)kind[part], m, hidden, (const uint8_t *)w[part], n_qkv, qkv + first,
                                 (u * d - first) / LANES, ((u + 1) * d - first) / LANES);
                    for (long r = 0; r < m; r++) place(qkv, n_qkv, r, u, cos, sin, lk, lv, kv_stride, start, heads, kv_heads, d);
                }
            } else
#endif
            {
                any_part(t, nt, kind[0], w[0], h, m, hidden, n_qkv, qkv);
#pragma omp barrier
#pragma omp for nowait
                for (long r = 0; r < m; r++)
                    for (long u = 0; u < units; u++) place(qkv, n_qkv, r, u, cos, sin, lk, lv, kv_stride, start, heads, kv_heads, d);
            }
#pragma omp barrier
            attention_part(t, nt, qkv, n_qkv, d, lk, lv, kv_stride, ends, m, heads, kv_heads, d, windows[layer],
                           scale, att);
#pragma omp barrier
            any_part(t, nt, kind[3], w[3], att, m, heads * d, hidden, y);
#pragma omp barrier
            for (long r = 0; r < m; r++) {
                for (long i = r * hidden; i < (r + 1) * hidden; i++) xp[i] = xp[i] + y[i];
                rms_rows(xp + r * hidden, 1, hidden, norms[2 * layer + 1], eps, h + r * hidden);
            }
#if INT8_ACTIVATIONS
            if (int8_kind(kind[4]) && inter % LANES == 0) { /* each thread the gate and up of its own columns */
                long vectors = inter / LANES, first = vectors * t / nt, last = vectors * (t + 1) / nt;
                own_rows(h, m, hidden, 1 << k_rows(kind[4]));
                int8_vectors((int)kind[4], m, hidden, (const uint8_t *)w[4], n_gu, gu, first, last);
                int8_vectors((int)kind[4], m, hidden, (const uint8_t *)w[4], n_gu, gu, first + vectors, last + vectors);
                silu_columns(gu, m, inter, first * LANES, last * LANES, act);
            } else
#endif
            {
                any_part(t, nt, kind[4], w[4], h, m, hidden, n_gu, gu);
#pragma omp barrier
#pragma omp for nowait
                for (long r = 0; r < m; r++) silu_columns(gu + r * n_gu, 1, inter, 0, inter, act + r * inter);
            }
#pragma omp barrier
            any_part(t, nt, kind[5], w[5], act, m, inter, hidden, y);
#pragma omp barrier
            for (long i = 0; i < m * hidden; i++) xp[i] = xp[i] + y[i];
            if (tap < n_taps && taps[tap] == layer + 1) {
                if (t == 0)
                    for (long r = 0; r < m; r++)
                        for (long i = 0; i < hidden; i++) tapped[(r * n_taps + tap) * hidden + i] = xp[r * hidden + i];
                tap++;
            }
        }
        if (t == 0)
            for (long i = 0; i < m * hidden; i++) x[i] = xp[i];
    }
}
