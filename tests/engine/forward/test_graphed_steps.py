"""The fixed-shape steps (`specdeck.engine.forward.graphed_steps`): the GPU's forward, replayed as CUDA graphs.

Each test runs on the CPU (the same arithmetic, uncaptured) and, in the GPU set (`pytest -m cuda`),
on CUDA with the graphs captured: Hugging Face's logits, each verified token with a plain step's
bits, and greedy speculative text equal to plain text where the top two logits nearly tie."""

import gc

import pytest
import torch
from test_llama_families import FAMILIES, build, feed_and_compare
from test_shape_invariance import _kept, _near_ties
from tiny import build_pair

from specdeck.engine import DecodeConfig, DraftModelDrafter, PromptLookupDrafter, encode_prompt, generate
from specdeck.engine.forward import graphed_steps, kvcache
from specdeck.engine.forward.graphed_steps import ROWS
from specdeck.engine.forward.kvcache import CachedModel
from specdeck.engine.forward.llama_forward import LlamaForward
from specdeck.engine.loading.models import LoadOptions, load_model


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def where(request, monkeypatch) -> torch.device:
    """Where the fixed-shape steps run: the CPU (made one of their devices for the test) or CUDA."""
    if request.param == "cuda":
        device = request.getfixturevalue("cuda")
    else:
        device = torch.device("cpu")
        monkeypatch.setattr(graphed_steps, "FIXED_SHAPE_DEVICES", frozenset({"cpu", "cuda"}))
    monkeypatch.delenv("SPECDECK_CUDA_GRAPHS", raising=False)
    return device


@pytest.mark.parametrize("family", FAMILIES)
def test_fixed_shape_steps_match_hugging_face(family, where):
    """A short first prompt, steps, a verify that grows the cache, a crop, a chunk longer than one
    fixed-shape forward, past the sliding window where there is one: Hugging Face's logits to 1e-4."""
    model = build(family).to(where)
    fast = LlamaForward(model, capacity=4)
    assert fast.steps is not None and fast.steps.capture == (where.type == "cuda")
    chunks = [[3, 9, 27, 17, 51, 25, 11, 33], [7], [21], [5, 6, 7, 8, 9, 10], None, [40, 41], list(range(1, 40))]
    feed_and_compare(model, fast, chunks)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_verify_gives_each_token_a_plain_steps_bits(family, dtype, where):
    """After a prompt, a forward over 2 to 2 x ROWS + 1 new tokens gives each token the logits, bit
    for bit, that one-token steps give it: the property that keeps greedy speculation exact."""
    lm = CachedModel(build(family).to(where, dtype))
    assert not lm.supports_trees  # a tree's side branches would break it: drafts are chains here
    ids = [(7 * i) % 60 + 3 for i in range(80)]
    lm.forward(ids[:30], last_only=True)
    steps = torch.cat([lm.forward([t]) for t in ids[30 : 31 + 2 * ROWS]])
    for n in (2, 5, ROWS, 2 * ROWS + 1):
        lm.crop(30)
        assert torch.equal(lm.forward(ids[30 : 30 + n]), steps[:n]), n


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_identity_holds_at_near_ties(tmp_path, where, dtype):
    """With the target's top two logits a few millionths apart at every step, speculative text (the
    target drafting for itself at K = 1, 3, 6 and 16, whose verify takes two fixed-shape forwards, and
    on the auto schedule) equals plain text."""
    target_dir, _ = build_pair(tmp_path, "llama")
    target = load_model(str(target_dir), LoadOptions(device=str(where), dtype=dtype))
    _near_ties(target.model)
    ids = encode_prompt(target.tokenizer, "The quick brown fox", chat=False)
    plain = _kept(generate(target, ids, DecodeConfig(max_new_tokens=40)))
    for config in [DecodeConfig(k=k, schedule="constant", lookup=0, max_new_tokens=40) for k in (1, 3, 6, 16)] + [
        DecodeConfig(max_new_tokens=40)
    ]:
        assert _kept(generate(target, ids, config, DraftModelDrafter(target.model))) == plain, config


def test_graph_replays_compute_what_the_uncaptured_steps_compute(cuda, monkeypatch):
    """On CUDA the captured graphs give the same bits as the same forward run kernel by kernel, and
    a graph is captured again when the cache grows."""
    monkeypatch.delenv("SPECDECK_CUDA_GRAPHS", raising=False)
    monkeypatch.setattr(graphed_steps, "MIN_CAPACITY", 16)
    model = build("llama-biased").to(cuda)
    graphed, uncaptured = LlamaForward(model, capacity=16), LlamaForward(model, capacity=16)
    assert graphed.steps is not None and uncaptured.steps is not None
    uncaptured.steps.capture = False
    with torch.inference_mode():
        for tokens in ([3, 9, 27, 17, 51], [7], [5, 6, 7, 8, 9, 10], [11] * 20, [12]):
            ids = torch.tensor(tokens, device=cuda)
            assert torch.equal(graphed.logits(ids, last_only=False), uncaptured.logits(ids, last_only=False))
    assert graphed.cache.keys.shape[3] > 16 and all(graph is not None for graph, _ in graphed.steps._graphs.values())


def test_cuda_graphs_off_runs_the_eager_forward(monkeypatch, cuda):
    """SPECDECK_CUDA_GRAPHS=0 leaves the GPU on the forward that launches each kernel from Python,
    with token trees."""
    monkeypatch.setenv("SPECDECK_CUDA_GRAPHS", "0")
    lm = CachedModel(build("llama-biased").to(cuda))
    assert lm.backend.steps is None and lm.supports_trees


def test_a_new_session_takes_the_steps_and_graphs_of_the_last(where, tmp_path):
    """When a session ends its lean forward (the cache and the graphs captured on it) goes back to
    its model, and the next session of the model takes it instead of capturing again: one forward
    serves a run of sessions, plain and speculative alike, and gives each the same text."""
    target_dir, _ = build_pair(tmp_path, "llama")
    target = load_model(str(target_dir), LoadOptions(device=str(where), dtype="float32"))
    ids = encode_prompt(target.tokenizer, "The quick brown fox", chat=False)
    plain = [_kept(generate(target, ids, DecodeConfig(max_new_tokens=12))) for _ in range(2)]
    config = DecodeConfig(k=3, schedule="constant", max_new_tokens=12)
    speculative = _kept(generate(target, ids, config, PromptLookupDrafter()))
    gc.collect()
    assert plain[0] == plain[1] == speculative
    assert len(kvcache._IDLE[target.model]) == 1


def test_where_graphs_cannot_be_captured_the_steps_run_uncaptured(monkeypatch, caplog):
    """A torch, driver or GPU that cannot capture a graph (here: a build without CUDA asked to
    capture) leaves the steps running at the same fixed shape, kernel by kernel, with the same
    logits, and says so once."""
    monkeypatch.setattr(graphed_steps, "FIXED_SHAPE_DEVICES", frozenset({"cpu", "cuda"}))
    monkeypatch.setattr(torch.cuda, "Stream", lambda *args: (_ for _ in ()).throw(RuntimeError("no capture")))
    model = build("llama-biased")
    wanting, uncaptured = LlamaForward(model), LlamaForward(model)
    assert wanting.steps is not None and uncaptured.steps is not None
    wanting.steps.capture, uncaptured.steps.capture = True, False
    with torch.inference_mode(), caplog.at_level("WARNING"):
        for tokens in ([3, 9, 27, 17, 51], [7], [5, 6, 7]):
            ids = torch.tensor(tokens)
            assert torch.equal(wanting.logits(ids, last_only=False), uncaptured.logits(ids, last_only=False))
    assert not wanting.steps.capture
    assert [r.message.count("CUDA graphs could not be captured") for r in caplog.records] == [1]


def test_the_report_says_steps_run_as_graphs(where):
    """`specdeck bench`'s report names the graphs beside the products' path where steps are fixed-shape."""
    model = build("llama-biased").to(where)
    assert f"replayed as a CUDA graph of {ROWS} rows" in kvcache.products_path(model)


def test_a_sessions_cache_size_follows_from_its_request_alone(where, tmp_path, monkeypatch):
    """A session's cache gets the capacity its prompt and new tokens call for, also when it takes
    over the forward of a longer or shorter session: a plain and a speculative run of one request
    attend over as many slots, whatever ran before."""
    monkeypatch.setattr(graphed_steps, "MIN_CAPACITY", 16)
    target_dir, _ = build_pair(tmp_path, "llama")
    target = load_model(str(target_dir), LoadOptions(device=str(where), dtype="float32"))
    ids = encode_prompt(target.tokenizer, "The quick brown fox", chat=False)
    capacities = []
    for new_tokens in (60, 8, 60):
        generate_kept = _kept(generate(target, ids, DecodeConfig(max_new_tokens=new_tokens)))
        assert len(generate_kept) == new_tokens
        gc.collect()
        (forward,) = kvcache._IDLE[target.model]
        capacities.append(forward.cache.keys.shape[3])
    wanted = [max(16, 1 << (len(ids) + n + ROWS - 1).bit_length()) for n in (60, 8, 60)]
    assert capacities == wanted and capacities[0] > capacities[1]
