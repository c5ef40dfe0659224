"""The built-in SmolLM2-135M-Instruct: real tokenizer, real text."""

import pytest

from engine import DecodeConfig, PromptLookupDrafter, TokenEvent, encode_prompt, generate, load_model


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2-135m-instruct")


def test_prompt_lookup_greedy_equals_plain_for_128_tokens(smollm2):
    """Prompt lookup's greedy output is the plain greedy output, and it does accept drafts."""
    prompt = ("Repeat this list exactly, then add one more item: apples, pears, plums, cherries, "
              "grapes, lemons, oranges, figs, dates, kiwis.")
    ids = encode_prompt(smollm2.tokenizer, prompt)
    config = DecodeConfig(k=4, max_new_tokens=128)
    plain = list(generate(smollm2, ids, config))
    spec = list(generate(smollm2, ids, config, PromptLookupDrafter()))
    kept = [e.token_id for e in spec if isinstance(e, TokenEvent) and e.state.kept]
    assert kept == [e.token_id for e in plain if isinstance(e, TokenEvent)]
    assert spec[-1].text == plain[-1].text
    assert spec[-1].accepted > 0


def test_chat_template_is_applied(smollm2):
    """Prompts go through the chat template unless raw completion is asked for."""
    chat = smollm2.tokenizer.decode(encode_prompt(smollm2.tokenizer, "Hello"))
    raw = smollm2.tokenizer.decode(encode_prompt(smollm2.tokenizer, "Hello", chat=False))
    assert "<|im_start|>user" in chat and chat.rstrip().endswith("assistant")
    assert "<|im_start|>" not in raw
