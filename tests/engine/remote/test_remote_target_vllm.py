"""The served target against a real vLLM on 127.0.0.1 (`make test-served` installs one): greedy
identity with vLLM's own completions for two drafters and several prompts, the built-in target
served from the folder SpecDeck converts it into, and a served model that computes nothing caught.

vLLM runs in a virtualenv of its own (it pins its own transformers): the tests start its server with
the Python that `SPECDECK_VLLM_PYTHON` names, and skip, saying so, without it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from serving import free_port, post, wait_until_serving

from specdeck.engine.config import DecodeConfig
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.events import RoundEvent, TokenEvent
from specdeck.engine.loading.gguf_conversion import convert_gguf
from specdeck.engine.loading.models import encode_prompt
from specdeck.engine.loading.registry import BUILTIN_MODELS, DEFAULT_DRAFT, DEFAULT_TARGET
from specdeck.engine.loop.decoding import generate
from specdeck.engine.pair import DrafterKind, PairSpec
from specdeck.engine.remote.remote_continuation import PLAIN_CHUNK
from specdeck.engine.remote.remote_target import RemoteSettings, connect
from specdeck.engine.session import load_pair, run_session

PYTHON = os.environ.get("SPECDECK_VLLM_PYTHON", "")
pytestmark = pytest.mark.skipif(
    not PYTHON or not Path(PYTHON).is_file(),
    reason="no vLLM to serve with: `make test-served` installs one and sets SPECDECK_VLLM_PYTHON",
)
PROMPTS = ["def fibonacci(n):", "The cat sat on the mat. The cat", "Once upon a time,"]
# the tokens of one KV-cache block, as docs/remote.md recommends: vLLM caches and reports cached tokens
# in whole blocks, so a round recomputes up to a block (docs/journal/2026-11-29-served-pace.md)
BLOCK = 32
GREEDY = DecodeConfig(k=4, schedule="constant", max_new_tokens=24)


def _serve(folder: Path):
    """A vLLM OpenAI server on `folder` (float32, model name "target"): (process, base URL)."""
    port = free_port()
    command = [
        PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--host", "127.0.0.1",
        "--port", str(port), "--served-model-name", "target", "--max-model-len", "2048", "--dtype", "float32",
        "--enable-prompt-tokens-details", "--block-size", str(BLOCK),
    ]  # fmt: skip
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    wait_until_serving(process, url, "vLLM's server", 300)  # about 2 minutes on 2 cores
    return process, url


@pytest.fixture(scope="module")
def served():
    """vLLM serving the folder SpecDeck converts the built-in GGUF into."""
    process, url = _serve(convert_gguf(BUILTIN_MODELS[DEFAULT_TARGET].path()))
    try:
        yield url
    finally:
        process.terminate()
        process.wait(timeout=60)


def _vllm_greedy(url: str, prompt: str, n: int) -> str:
    return post(url + "/completions", {"model": "target", "prompt": prompt, "max_tokens": n, "temperature": 0})[
        "choices"
    ][0]["text"]


@pytest.mark.parametrize(
    "drafter, draft", [(DrafterKind.PROMPT_LOOKUP, None), (DrafterKind.DRAFT_MODEL, DEFAULT_DRAFT)]
)
def test_speculative_text_against_vllm_is_vllms_own_greedy_text(served, drafter, draft):
    """For each prompt, drafting locally and verifying on vLLM writes vLLM's own greedy completion,
    with some drafts accepted (fewer requests than tokens over the prompts)."""
    pair = load_pair(PairSpec(served, draft, drafter, device="cpu", target_model="target"))
    accepted = 0
    for prompt in PROMPTS:
        ids = encode_prompt(pair.target.tokenizer, prompt, chat=False)
        summary = list(generate(pair.target, ids, GREEDY, pair.make_drafter()))[-1]
        assert summary.text == _vllm_greedy(served, prompt, GREEDY.max_new_tokens), prompt
        accepted += summary.accepted
    assert accepted > 0


def test_vllm_serves_the_converted_target_as_specdeck_decodes_it(served, monkeypatch):
    """The converted built-in model on vLLM (float32) gives the greedy text SpecDeck's own plain
    decoding of the same model gives on float32 products (`SPECDECK_GGUF_BLOCKS=off`: the GGUF
    blocks' 8-bit rows are another arithmetic, which a near-tie could tell apart)."""
    monkeypatch.setenv("SPECDECK_GGUF_BLOCKS", "off")
    local = load_pair(PairSpec(device="cpu", dtype="float32", backend="torch"))
    for prompt in PROMPTS:
        plain = [
            e.token_id for e in run_session(local, prompt, GREEDY, chat=False, plain=True) if isinstance(e, TokenEvent)
        ]
        assert local.target.tokenizer.decode(plain) == _vllm_greedy(served, prompt, GREEDY.max_new_tokens), prompt


LONG_PROMPT = " ".join(f"Item {n}: the parcel for house {n} goes to the blue door." for n in range(1, 90))


def test_a_round_after_a_long_prompt_computes_its_new_tokens_on_vllm(served):
    """After a prompt of about 1,500 tokens each round makes vLLM compute its new tokens (at most a
    cache block's worth, as vLLM reports them) rather than the prompt again, keeps all K + 1 tokens
    of vLLM's continuation, and the text is vLLM's own; plain decoding asks for chunks of it; the
    drafts scored as prompt (`prompt_logprobs`) make it recompute the whole prompt."""
    pair = load_pair(PairSpec(served, None, DrafterKind.PROMPT_LOOKUP, device="cpu", target_model="target"))
    ids = encode_prompt(pair.target.tokenizer, LONG_PROMPT, chat=False)
    config = DecodeConfig(k=4, schedule="constant", lookup=0, max_new_tokens=12)
    events = list(generate(pair.target, ids, config, pair.make_drafter()))
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    computed = [r.recomputed_tokens for r in rounds]
    assert len(ids) > 1400 and computed[0] >= len(ids) - BLOCK
    assert max(computed[1:]) <= BLOCK + config.k + 1
    assert [r.accepted + 1 + r.continued for r in rounds] == [5, 5, 2]
    assert events[-1].text == _vllm_greedy(served, LONG_PROMPT, config.max_new_tokens)

    plain = list(generate(pair.target, ids, DecodeConfig(max_new_tokens=PLAIN_CHUNK + 4)))
    assert plain[-1].rounds == 2 and plain[-1].text == _vllm_greedy(served, LONG_PROMPT, PLAIN_CHUNK + 4)

    scored = connect(RemoteSettings(served, "target", 120.0, "score"), pair.target.tokenizer)
    events = list(generate(scored, ids, DecodeConfig(k=2, schedule="constant", max_new_tokens=2), pair.make_drafter()))
    assert all(e.recomputed_tokens >= len(ids) for e in events if isinstance(e, RoundEvent))


def test_wrong_model_name_on_vllm_lists_the_served_one(served):
    with pytest.raises(SpecDeckError, match="serves target, not 'llama-70b'"):
        load_pair(PairSpec(served, None, DrafterKind.PROMPT_LOOKUP, target_model="llama-70b"))


def test_a_vllm_whose_model_did_not_load_its_weights_stops_the_session(tmp_path):
    """A folder that keeps the tied embedding only as lm_head.weight (as SpecDeck's conversions did)
    makes vLLM answer the same log-probability for every token: the session stops saying so, instead
    of writing text that agrees with any draft."""
    folder = tmp_path / "untied-name"
    shutil.copytree(convert_gguf(BUILTIN_MODELS[DEFAULT_TARGET].path()), folder)
    weights = load_file(str(folder / "model.safetensors"))
    weights["lm_head.weight"] = weights.pop("model.embed_tokens.weight")
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    process, url = _serve(folder)
    try:
        pair = load_pair(PairSpec(url, None, DrafterKind.PROMPT_LOOKUP, device="cpu", target_model="target"))
        ids = encode_prompt(pair.target.tokenizer, PROMPTS[1], chat=False)
        with pytest.raises(SpecDeckError, match="same log-probability for every token"):
            list(generate(pair.target, ids, GREEDY, pair.make_drafter()))
    finally:
        process.terminate()
        process.wait(timeout=60)
