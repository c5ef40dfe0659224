"""Each block type a downloaded GGUF file may hold gives a position the same logits on llama.cpp in a
one-token call (a plain step) as inside a several-token call (a verify), so greedy speculative text
equals plain text: the built-in Q4_1 file and its requantizations to Q8_0, Q6_K and Q4_K_M (which
hold Q5_0, Q4_K, Q6_K and Q8_0 matrices between them; `specdeck.engine.forward.llamacpp_backend` says which kernels
llama.cpp picks by call shape)."""

import pytest
import torch
from call_shapes import logits_in_calls

from specdeck.engine import DecodeConfig, PromptLookupDrafter, TokenEvent, encode_prompt, generate
from specdeck.engine.forward.llamacpp_backend import LlamaCppForward, LlamaCppModel, library
from specdeck.engine.loading.models import LoadedModel, LoadOptions, load_model
from specdeck.engine.loading.registry import DEFAULT_TARGET

pytestmark = pytest.mark.skipif(library() is None, reason="llama-cpp-python is not installed (`make` builds it)")

FILE_TYPES = ("Q4_1", "Q8_0", "Q6_K", "Q4_K_M")
# a code prompt whose answer copies much of it: prompt lookup drafts long runs, some refused
CODE_PROMPT = """Add type hints to this function and keep everything else as it is.

```python
def merge_counts(left, right):
    merged = dict(left)
    for key, value in right.items():
        merged[key] = merged.get(key, 0) + value
    return merged
```"""


@pytest.fixture(scope="module")
def tokenizer():
    return load_model(DEFAULT_TARGET, LoadOptions(backend="llama.cpp")).tokenizer


@pytest.mark.parametrize("context", [12, 300])
@pytest.mark.parametrize("file_type", FILE_TYPES)
def test_a_position_gets_the_same_logits_in_every_call_shape(requantized_builtin, file_type, context):
    """After 12 or 300 cached tokens, the logits of 24 tokens fed one a call are the same bits as in
    calls of 2 to 16 tokens (4 and more take llama.cpp's repacked and tiled kernels where allowed)
    and with the final-norm states asked for too."""
    forward = LlamaCppForward(LlamaCppModel(requantized_builtin(file_type)))
    forward.logits(torch.tensor([(7 * i + 3) % 40000 for i in range(context)]), last_only=True)
    tokens = list(range(2000, 2024))
    one_at_a_time = logits_in_calls(forward, tokens, [1] * 24, states=False)
    for sizes, states in (([2, 3, 4, 5, 9, 1], False), ([8, 16], False), ([4, 4, 16], True)):
        forward.crop(context)
        assert torch.equal(logits_in_calls(forward, tokens, sizes, states), one_at_a_time), (sizes, states)


def _kept(events) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept]


@pytest.mark.parametrize("file_type", FILE_TYPES)
def test_greedy_speculative_text_equals_plain_text(requantized_builtin, tokenizer, file_type):
    """Prompt lookup drafting up to 8 tokens a round on a code prompt keeps plain greedy decoding's 64
    tokens on every block type, with drafts both accepted and refused."""
    model = LlamaCppModel(requantized_builtin(file_type))
    target = LoadedModel(file_type, model, tokenizer, model.device, torch.float32)
    ids = encode_prompt(tokenizer, CODE_PROMPT)
    config = DecodeConfig(max_new_tokens=64, k=8, schedule="constant", lookup=0)
    plain = _kept(generate(target, ids, config))
    events = list(generate(target, ids, config, PromptLookupDrafter()))
    assert _kept(events) == plain
    summary = events[-1]
    assert 0 < summary.accepted < summary.drafted
