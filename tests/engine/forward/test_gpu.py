"""The GPU set (`pytest -m cuda`): what the engine promises, checked on the GPU itself. Skipped,
with the reason, where there is none; `SPECDECK_TEST_DEVICE=cpu` rehearses the tests that do not
need CUDA's own counters on the CPU.

Seeds repeat per device: the same seed gives the same text on the same GPU, not the CPU's text."""

import json
import warnings

import pytest
import torch
from sampling_checks import chi_square, chi_square_quantile, exact_two_token_distribution, sample_two_tokens
from test_llama_families import FAMILIES, build, feed_and_compare, reference
from tiny import build_model, build_pair, write_two_prompts

from specdeck.cli.main import main
from specdeck.engine import (
    DecodeConfig,
    DraftModelDrafter,
    PromptLookupDrafter,
    SuffixDrafter,
    TokenEvent,
    encode_prompt,
    generate,
)
from specdeck.engine.drafting.head_drafter import FeatureHeadDrafter
from specdeck.engine.drafting.heads import FeatureHead, head_config
from specdeck.engine.drafting.suffix import SuffixIndex
from specdeck.engine.forward.llama_forward import LlamaForward
from specdeck.engine.loading.models import LoadOptions, load_model
from specdeck.engine.memory import give_back
from specdeck.engine.pair import PairSpec
from specdeck.engine.session import load_pair

pytestmark = pytest.mark.cuda
PROMPT = "The quick brown fox"


def kept(events) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept]


@pytest.fixture
def folders(tiny_root):
    return build_pair(tiny_root / "gpu", "llama", noise=0.2)


@pytest.fixture
def pair(folders, device):
    """The tiny target and its noisy draft on the GPU, in float32."""
    options = LoadOptions(device=str(device), dtype="float32")
    return load_model(str(folders[0]), options), load_model(str(folders[1]), options)


def lean_device(device: torch.device) -> torch.device:
    if device.type not in ("cpu", "cuda"):
        pytest.skip(f"the lean forward runs on the CPU and CUDA; {device.type} runs Hugging Face's")
    return device


@pytest.mark.parametrize("family", FAMILIES)
def test_lean_forward_matches_hugging_face_in_float32(family, device):
    """Prefill, steps, a verify chunk that grows the cache, a crop: Hugging Face's logits to 1e-4."""
    model = build(family).to(lean_device(device))
    chunks = [[3, 9, 27, 17, 51, 25, 11, 33], [7], [21], [5, 6, 7, 8, 9, 10], None, [40, 41], [42]]
    feed_and_compare(model, LlamaForward(model, capacity=4), chunks)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "mistral"])
def test_lean_forward_in_bfloat16_is_as_close_as_hugging_faces(family, device):
    """In bfloat16 the lean forward's logits are as close to the float32 ones as Hugging Face's own
    bfloat16 forward is (within twice its error, plus bfloat16's step)."""
    model = build(family).to(lean_device(device))
    ids = [3, 9, 27, 17, 51, 25, 11, 33, 7, 21, 5, 6]
    exact = reference(model, ids).float()
    model = model.to(torch.bfloat16)
    fast = LlamaForward(model)
    with torch.inference_mode():
        ours = torch.cat(
            [
                fast.logits(torch.tensor(ids[:8], device=device), False),
                fast.logits(torch.tensor(ids[8:9], device=device), False),
                fast.logits(torch.tensor(ids[9:], device=device), False),
            ]
        ).float()
    theirs = reference(model, ids).float()
    assert (ours - exact).abs().max() <= 2 * (theirs - exact).abs().max() + 2**-7


@pytest.mark.parametrize("drafter", ["draft-model", "feature-head", "prompt-lookup", "suffix"])
def test_greedy_speculative_equals_plain_for_every_drafter(pair, device, drafter):
    """On the GPU in float32, every drafter's greedy text is plain decoding's, for K = 1, 3, 6."""
    target, draft = pair
    torch.manual_seed(0)
    head = FeatureHead(head_config(target.model.config)).to(device).eval()
    make = {
        "draft-model": lambda: DraftModelDrafter(draft.model),
        "feature-head": lambda: FeatureHeadDrafter(head, target.model),
        "prompt-lookup": lambda: PromptLookupDrafter(device=device),
        "suffix": lambda: SuffixDrafter(SuffixIndex(), device=device),
    }[drafter]
    ids = encode_prompt(target.tokenizer, "The quick brown fox jumps over the lazy dog. The quick", chat=False)
    plain = kept(generate(target, ids, DecodeConfig(max_new_tokens=32)))
    for k in (1, 3, 6):
        config = DecodeConfig(k=k, schedule="constant", max_new_tokens=32)
        assert kept(generate(target, ids, config, make())) == plain, k


def test_speculative_sampling_follows_the_target_with_device_generators(pair):
    """Over 1000 seeds, with the session's generator on the GPU, the first two tokens of speculative
    sampling follow the target's exact distribution (chi-square at 0.1%)."""
    target, draft = pair
    ids = encode_prompt(target.tokenizer, "The quick brown", chat=False)
    config = DecodeConfig(k=3, schedule="constant", temperature=0.8, top_k=40, top_p=0.9, max_new_tokens=2)
    n = 1000
    counts, rejections = sample_two_tokens(target, ids, config, lambda: DraftModelDrafter(draft.model), n)
    assert 0.05 * n < rejections < 0.95 * n
    stat, df = chi_square(counts, exact_two_token_distribution(target, ids, config), n)
    assert df >= 5 and stat < chi_square_quantile(df)


def test_a_seed_repeats_on_the_same_device(pair):
    """The same seed gives the same sampled text twice on the GPU; another seed gives other text."""
    target, draft = pair
    ids = encode_prompt(target.tokenizer, PROMPT, chat=False)

    def text(seed: int) -> list[int]:
        config = DecodeConfig(k=3, schedule="constant", temperature=1.0, seed=seed, max_new_tokens=24)
        return kept(generate(target, ids, config, DraftModelDrafter(draft.model)))

    assert text(7) == text(7)
    assert text(7) != text(8)


def syncs(target, ids: list[int], new_tokens: int) -> int:
    """Host-device synchronisations in a plain greedy session (torch.cuda.set_sync_debug_mode)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            list(generate(target, ids, DecodeConfig(max_new_tokens=new_tokens)))
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def test_host_syncs_per_token_are_few_and_do_not_grow_with_depth(folders, cuda, tiny_root):
    """Plain decoding waits for the GPU at most 8 times per token, and no more often for a model
    twice as deep (no wait inside the layers)."""
    options = LoadOptions(device=str(cuda), dtype="float32")
    shallow = load_model(str(folders[0]), options)
    deep_dir = tiny_root / "gpu-deep"
    shallow.tokenizer.save_pretrained(deep_dir)
    build_model(deep_dir, "llama", shallow.vocab_width, seed=0, layers=4, eos_token_id=None)
    deep = load_model(str(deep_dir), options)
    ids = encode_prompt(shallow.tokenizer, PROMPT, chat=False)
    per_token = [(syncs(m, ids, 24) - syncs(m, ids, 8)) / 16 for m in (shallow, deep)]
    assert per_token[0] <= 8
    assert per_token[1] <= per_token[0]


def test_memory_returns_to_its_baseline_after_unloading(folders, cuda):
    """Loading a pair, running a session and dropping the pair leaves the GPU's allocated and
    reserved memory where they were before the load."""
    torch.ones(8, 8, device=cuda) @ torch.ones(8, 8, device=cuda)  # cuBLAS keeps a workspace from its first product on
    give_back()
    allocated, reserved = torch.cuda.memory_allocated(cuda), torch.cuda.memory_reserved(cuda)
    pair = load_pair(PairSpec(str(folders[0]), str(folders[1]), "draft-model", str(cuda), "float32"))
    ids = encode_prompt(pair.target.tokenizer, PROMPT, chat=False)
    list(generate(pair.target, ids, DecodeConfig(max_new_tokens=16), pair.make_drafter()))
    assert torch.cuda.memory_allocated(cuda) > allocated
    del pair
    give_back()
    assert torch.cuda.memory_allocated(cuda) == allocated
    assert torch.cuda.memory_reserved(cuda) <= reserved


def test_specdeck_run_on_the_gpu(folders, device, capsys):
    """`specdeck run --device cuda` (or mps) prints the text and a summary naming the device."""
    status = main(
        [
            "run",
            "--target",
            str(folders[0]),
            "--draft",
            str(folders[1]),
            "--device",
            device.type,
            "--no-chat",
            "--prompt",
            PROMPT,
            "--max-new-tokens",
            "12",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0 and f"on {device.type}" in out


def test_a_short_bench_on_the_gpu(folders, device, tmp_path, capsys):
    """`specdeck bench` on the GPU: every speculative text equals plain decoding's."""
    out = tmp_path / "out"
    status = main(
        [
            "bench",
            "--target",
            str(folders[0]),
            "--drafter",
            "prompt-lookup",
            "--prompts",
            str(write_two_prompts(tmp_path / "prompts.jsonl")),
            "--k",
            "1,2",
            "--repeats",
            "1",
            "--max-new-tokens",
            "8",
            "--baselines",
            "plain",
            "--device",
            device.type,
            "--out",
            str(out),
        ]
    )
    assert status == 0
    rows = (out / "per_prompt.csv").read_text(encoding="utf-8").splitlines()
    assert len(rows) > 2 and "false" not in json.dumps(rows)
