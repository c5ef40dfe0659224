"""A verify over n tokens gives each token the logits a one-token step gives it, bit for bit, so
greedy speculative text equals plain text even where the target's top two logits nearly tie."""

import pytest
import torch
import torch.nn.functional as F
from tiny import ON_CPU, PACKED_PATHS, build_pair

from specdeck.engine import DecodeConfig, DraftModelDrafter, TokenEvent, encode_prompt, generate
from specdeck.engine.forward import kernel_build, linear, row_attention, row_kernel
from specdeck.engine.forward.kvcache import CachedModel
from specdeck.engine.forward.linear import PackedLinear, layout_for, packed_available
from specdeck.engine.forward.row_kernel import KernelLinear
from specdeck.engine.loading.models import load_model
from specdeck.engine.loop import target_forward

needs_packed = pytest.mark.skipif(not PACKED_PATHS, reason="no product path here keeps a row's bits")


def _kept(events) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept]


@pytest.fixture(params=PACKED_PATHS or ["packed"])
def packed_llama(request, tmp_path, monkeypatch):
    """A tiny Llama whose every product runs on a packed path (oneDNN's, the row kernel), as on a
    machine that chose it."""
    monkeypatch.setenv("SPECDECK_LINEAR", request.param)
    target_dir, _ = build_pair(tmp_path, "llama")
    return load_model(str(target_dir), ON_CPU)


def _avx2_build():
    """The row kernel's AVX2 variant, on a machine that has AVX2 and FMA (also where this CPU's own
    build takes AVX-512): the path an AVX2-only CPU runs."""
    if "kernel" not in PACKED_PATHS:
        pytest.skip("the row kernel does not build here")
    if not {"avx2", "fma"} <= set(kernel_build.cpu_flags().split()):
        pytest.skip("this CPU has no AVX2 with FMA")
    built = kernel_build.build("haswell")
    assert not isinstance(built, str), built
    assert built.row_kernel_block() == 16  # the AVX2 blocks, not AVX-512's
    return built


@pytest.mark.skipif("kernel" not in PACKED_PATHS, reason="the row kernel does not build here")
@pytest.mark.parametrize("build", ["this CPU's", "AVX2"])
@pytest.mark.parametrize("shape", [(1728, 576), (576, 1536), (49152, 64), (100, 64), (7, 33)])
def test_the_row_kernel_gives_each_row_the_same_bits(shape, build):
    """The row kernel's product of a row is the same alone as among 2..20 rows (groups of up to 8
    rows, blocks of columns split between threads, a last block narrower than the rest, rows
    padded to whole vectors), it is the matrix product to float32 rounding, and its packed
    weight gives back the matrix bit for bit; in this CPU's build and in the AVX2 one."""
    built = kernel_build.library() if build == "this CPU's" else _avx2_build()
    generator = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(*shape, generator=generator), torch.randn(shape[0], generator=generator)
    linear = KernelLinear(weight, bias, built)
    assert torch.equal(linear.dense(), weight)
    x = torch.randn(20, shape[1], generator=generator)
    alone = torch.cat([linear(x[j : j + 1]) for j in range(20)])
    for n in (2, 3, 5, 8, 9, 16, 20):
        assert torch.equal(linear(x[:n]), alone[:n]), n
    _assert_within_float32_rounding(alone, x, weight, bias)


def _assert_within_float32_rounding(out, x, weight, bias) -> None:
    """`out` is x @ weight.T + bias to float32 rounding of a sum in any order: each element within
    1e-5 of its terms' summed magnitudes of the float64 product (a dropped or doubled term misses by
    orders of magnitude; another CPU's `F.linear` would only sum in another order)."""
    exact = x.double() @ weight.double().T + bias.double()
    magnitude = x.double().abs() @ weight.double().abs().T + bias.double().abs()
    error = (out.double() - exact).abs()
    assert bool((error <= 1e-5 * magnitude).all()), float((error / magnitude).max())


def test_without_the_row_kernel_the_products_choose_another_path(monkeypatch, tmp_path):
    """Where the row kernel cannot be built (here its source is missing, as from a bundle that left
    it out), `build` says why, and products and attention run on PyTorch's paths."""
    monkeypatch.setattr(kernel_build, "SOURCE", tmp_path / "row_kernel.c")
    reason = kernel_build.build()
    assert isinstance(reason, str) and "not installed" in reason
    monkeypatch.setattr(kernel_build, "_LIBRARY", [reason])
    monkeypatch.setattr(linear, "_MEASURED", {})
    choice = linear.choose_path([torch.randn(64, 32)])
    assert choice.path != "kernel" and "row kernel" not in choice.reason
    assert row_kernel.attention_unavailable(torch.float32, torch.device("cpu"), 64) == reason


def test_weights_off_the_cpu_take_f_linear_and_say_why_once(monkeypatch):
    """A GPU's weights take `F.linear`; the report's reason says where the weights are, once (both
    packed paths refuse for that one reason)."""
    monkeypatch.setattr(linear, "_MEASURED", {})
    choice = linear.choose_path([torch.empty(64, 32, device="meta")])
    assert (choice.path, choice.reason) == ("dense", "the weights are on meta")


@pytest.mark.skipif(packed_available(torch.zeros(2, 2)) is not None, reason="this torch has no oneDNN packed linear")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("shape", [(1728, 576), (576, 1536), (320, 64)])
def test_packed_products_give_each_row_the_same_bits(shape, rows, dtype):
    """A row's product is the same alone as among 2..16 rows, in the layout this machine takes for
    calls of at least `rows` rows (whole rows or slices of them), on rows the layout was not chosen
    on; in bfloat16 too, where a layout is found (else the model's products stay on F.linear)."""
    weight = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    if (missing := packed_available(weight)) is not None:
        pytest.skip(missing)
    layout = layout_for(weight, rows)
    if layout is None and dtype == torch.bfloat16:
        pytest.skip("no packed bfloat16 layout keeps a row's bits on this machine")
    assert layout is not None, "no packed layout keeps a row's bits on this machine"
    linear = PackedLinear(weight, layout=layout)
    for seed in range(2, 8):
        x = torch.randn(16, shape[1], generator=torch.Generator().manual_seed(seed)).to(dtype)
        for n in (2, 3, 4, 8, 16):
            batch = linear(x[:n])
            assert all(torch.equal(linear(x[j : j + 1]), batch[j : j + 1]) for j in range(n)), (seed, n)


ATTENTIONS = ["layers on the row kernel", "row kernel", "queries batched", "fused call per query"]


def _attention(kind: str, monkeypatch, model) -> None:
    """Layers after cached positions as a machine of this `kind` runs them: each in one call of the
    row kernel (`specdeck.engine.forward.fused_layers`) where it builds; or their small operations in PyTorch and
    attention on the row kernel (SPECDECK_FUSED_LAYERS=0), else spelled out with a verify's queries
    batched, or each query in a fused call. Queries are batched only where this machine's own check
    finds them exact at the model's shape, as the engine decides: elsewhere it never takes that path."""
    if kind in ("layers on the row kernel", "row kernel") and "kernel" not in PACKED_PATHS:
        pytest.skip("the row kernel does not build here")
    if kind == "layers on the row kernel":
        return
    monkeypatch.setenv("SPECDECK_FUSED_LAYERS", "0")
    if kind == "row kernel":
        return
    if kind == "queries batched":
        config = model.config
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        if not row_attention.rows_invariant(heads, kv_heads, head_dim, torch.float32, torch.device("cpu")):
            pytest.skip("batched queries change a row's bits on this machine, so the engine attends per query here")
    monkeypatch.setattr(row_kernel, "attention_unavailable", lambda *shape: "not on this machine")
    monkeypatch.setattr(row_attention, "rows_invariant", lambda *shape: kind == "queries batched")


def _layers_as_asked(forward, attention: str) -> None:
    """The layers run in one row kernel call each exactly where asked, which needs the products on
    the row kernel too (not oneDNN's)."""
    if attention == "layers on the row kernel" and forward.weights.products.path != "kernel":
        pytest.skip("the layers run on the row kernel only where its products do")
    assert (forward.fused is not None) == (attention == "layers on the row kernel")


@needs_packed
@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("prompt", [30, 58], ids=["one attention span", "across a span's end"])
def test_verify_logits_equal_one_token_steps(packed_llama, prompt, attention, monkeypatch):
    """After a prompt, a forward over 2..16 new tokens gives each the logits of one-token steps,
    also where its queries' attention spans end on both sides of a multiple of `SPAN` slots, on the
    row kernel's attention, and on a machine whose batched products would change a row's bits (each
    query in a fused call)."""
    _attention(attention, monkeypatch, packed_llama.model)
    lm = CachedModel(packed_llama.model)
    assert lm.backend.row_exact
    _layers_as_asked(lm.backend, attention)
    ids = list(range(3, 100))
    lm.forward(ids[:prompt], last_only=True)
    steps = torch.cat([lm.forward([t]) for t in ids[prompt : prompt + 16]])
    for n in (2, 5, 16):
        lm.crop(prompt)
        assert torch.equal(lm.forward(ids[prompt : prompt + n]), steps[:n]), n


def test_row_attention_is_attention():
    """The spelled-out attention is the fused kernel's, to float32 rounding, under grouped key/value
    heads, a causal chunk and a sliding window."""
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(1, 8, 6, 16, generator=generator)
    keys, values = torch.randn(2, 1, 4, 128, 16, generator=generator)
    ends = [70 + j for j in range(6)]
    for window in (None, 20):
        calls = row_attention.plan(list(range(6)), ends, window, 2, True, torch.float32, torch.device("cpu"))
        assert [call.rows for call in calls] == [(0, 6)]
        out = row_attention.attend(q, keys, values, calls[0].mask, 0.25)
        for j, end in enumerate(ends):
            low = 0 if window is None else end - window
            fused = F.scaled_dot_product_attention(
                q[:, :, j : j + 1], keys[:, :, low:end], values[:, :, low:end], scale=0.25, enable_gqa=True
            )
            torch.testing.assert_close(out[:, :, j : j + 1], fused)


@pytest.mark.skipif("kernel" not in PACKED_PATHS, reason="the row kernel does not build here")
@pytest.mark.parametrize("build", ["this CPU's", "AVX2"])
@pytest.mark.parametrize("heads, kv_heads, head_dim", [(8, 2, 32), (9, 3, 64), (12, 2, 48), (4, 4, 64)])
def test_the_row_kernel_attention_is_attention(heads, kv_heads, head_dim, build):
    """The row kernel's attention is the fused kernel's to float32 rounding, under grouped key/value
    heads, a causal chunk and a sliding window, reading queries where the rotary left them (every
    head's slice of a wider row), and a query gets the same bits alone as beside others (the heads of
    a group then share a pass over their slots in other numbers); spans of slots that end inside a
    block of scores summed together, in this CPU's build and in the AVX2 one."""
    built = kernel_build.library() if build == "this CPU's" else _avx2_build()
    generator = torch.Generator().manual_seed(3)
    qk = torch.randn(1, 6, heads + kv_heads, head_dim, generator=generator)
    q = qk[:, :, :heads].transpose(1, 2)  # (1, heads, 6, head_dim), as the forward passes it
    keys, values = torch.randn(2, 1, kv_heads, 256, head_dim, generator=generator)
    ends = torch.tensor([70 + j for j in range(6)])
    for window in (None, 20, 7):
        out = row_kernel.attend(q, keys, values, ends, window, 0.25, built)
        for j, end in enumerate(ends.tolist()):
            low = 0 if window is None else end - window
            fused = F.scaled_dot_product_attention(
                q[:, :, j : j + 1], keys[:, :, low:end], values[:, :, low:end], scale=0.25, enable_gqa=True
            )
            torch.testing.assert_close(out[:, :, j : j + 1], fused)
            alone = row_kernel.attend(q[:, :, j : j + 1], keys, values, ends[j : j + 1], window, 0.25, built)
            assert torch.equal(out[:, :, j : j + 1], alone), (window, j)


def test_a_verify_attends_in_one_call_per_span():
    """Queries share a call only where their spans agree and the machine keeps their bits."""
    ends = [62, 63, 64, 65, 66]
    cpu = torch.device("cpu")
    assert [c.rows for c in row_attention.plan(list(range(5)), ends, None, 1, True, torch.float32, cpu)] == [
        (0, 3),
        (3, 5),
    ]
    assert [c.length for c in row_attention.plan(list(range(5)), ends, None, 1, True, torch.float32, cpu)] == [64, 128]
    fused = row_attention.plan(list(range(5)), ends, None, 1, False, torch.float32, cpu)
    assert [c.rows for c in fused] == [(j, j + 1) for j in range(5)] and all(c.fused for c in fused)


def _near_ties(model: torch.nn.Module) -> None:
    """Make every output row's odd neighbour a copy scaled by 1 + 1e-6: wherever one of a pair is the
    argmax the other trails it by a few millionths, far inside float32's rounding of a reordered sum."""
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head[1::2] = head[0:-1:2][: head[1::2].shape[0]] * (1 + 1e-6)


@needs_packed
def test_greedy_identity_holds_at_near_ties(packed_llama):
    """With the target's top two logits a few millionths apart at every step, speculative text
    (the target drafting for itself, every K, and the auto schedule) equals plain text."""
    _near_ties(packed_llama.model)
    ids = encode_prompt(packed_llama.tokenizer, "The quick brown fox", chat=False)
    plain = _kept(generate(packed_llama, ids, DecodeConfig(max_new_tokens=40)))
    with torch.inference_mode():
        logits = packed_llama.model(input_ids=torch.tensor([ids + plain[:-1]])).logits[0, len(ids) - 1 :]
    top2 = logits.topk(2, dim=-1).values
    assert float((top2[:, 0] - top2[:, 1]).max()) < 1e-3  # every step is a near-tie
    for config in [DecodeConfig(k=k, schedule="constant", lookup=0, max_new_tokens=40) for k in (1, 3, 6)] + [
        DecodeConfig(max_new_tokens=40)
    ]:
        events = list(generate(packed_llama, ids, config, DraftModelDrafter(packed_llama.model)))
        assert _kept(events) == plain, config


@needs_packed
@pytest.mark.parametrize(
    "parents",
    [[-1, 0, 1, 0, 0], [-1, 0, 1, 0, 3, 0, 5, 4]],
    ids=["alternatives to the first draft", "branches of depth two and three"],
)
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_tree_nodes_get_the_logits_of_their_own_path(packed_llama, parents, attention, monkeypatch):
    """In a tree forward (a chain and branches beside it) each node's logits equal, bit for bit,
    one-token steps along its own path; keeping a branch's path leaves the cache as if only that
    path had been fed. Where the layers run on the row kernel, whose steps round their small
    operations otherwise than a side branch's eager layers, the forward takes no trees."""
    _attention(attention, monkeypatch, packed_llama.model)
    from specdeck.engine.forward.attention_masks import tree_paths
    from specdeck.engine.forward.llama_forward import LlamaForward

    forward = LlamaForward(packed_llama.model)
    _layers_as_asked(forward, attention)
    if attention == "layers on the row kernel":
        assert not forward.supports_trees
        return
    assert forward.supports_trees
    forward.hidden(torch.arange(5, 30))
    start = len(forward)
    ids = list(range(40, 40 + len(parents)))
    tree = forward.output_layer(forward.hidden_tree(torch.tensor(ids), parents))
    for path in tree_paths(parents):
        forward.crop(start)
        steps = torch.cat([forward.hidden(torch.tensor([ids[i]])) for i in path])
        assert torch.equal(forward.output_layer(steps), tree[path]), path
    branch = tree_paths(parents)[-1]
    forward.crop(start)
    forward.hidden_tree(torch.tensor(ids), parents)
    forward.compact(branch)
    after_tree = forward.output_layer(forward.hidden(torch.tensor([50])))
    forward.crop(start)
    forward.hidden(torch.tensor([ids[i] for i in branch]))
    assert torch.equal(after_tree, forward.output_layer(forward.hidden(torch.tensor([50]))))


def test_keeping_a_tree_path_after_the_cache_grew(tiny_llama):
    """A cache that grew past its first capacity (inside a forward) still takes a kept tree path."""
    target, _ = tiny_llama
    lm = CachedModel(target.model)
    lm.forward(list(range(3, 303)), last_only=True)
    lm.forward_tree([40, 41, 42, 43], [-1, 0, 1, 0])
    lm.compact([0, 3])
    assert len(lm) == 302


def test_a_fall_back_to_f_linear_is_said_once(tmp_path, monkeypatch, caplog):
    """Where the target's products run on F.linear, a speculative session says once that its text may
    part from plain text at a near-tie, with the reason; a plain session, with nothing to part
    from, says nothing."""
    monkeypatch.setenv("SPECDECK_LINEAR", "dense")
    monkeypatch.setattr(target_forward, "_TOLD", set())
    target_dir, draft_dir = build_pair(tmp_path, "llama")
    target, draft = load_model(str(target_dir), ON_CPU), load_model(str(draft_dir), ON_CPU)
    ids = encode_prompt(target.tokenizer, "one two three", chat=False)
    config = DecodeConfig(max_new_tokens=4, k=2)

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "F.linear" in r.getMessage()]

    list(generate(target, ids, config))
    assert said() == []
    for _ in range(2):
        list(generate(target, ids, config, DraftModelDrafter(draft.model)))
    assert len(said()) == 1 and "(SPECDECK_LINEAR=dense)" in said()[0] and "near-tie" in said()[0]
