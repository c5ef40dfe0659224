"""The built-in SmolLM2-135M-Instruct: real tokenizer, real text."""

from pathlib import Path

import pytest
from tiny import ON_CPU, head_session_keeps_plain_text

from specdeck.engine import (
    DecodeConfig,
    DraftModelDrafter,
    PromptLookupDrafter,
    TokenEvent,
    encode_prompt,
    generate,
    load_model,
)


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2-135m-instruct", ON_CPU)


def test_prompt_lookup_greedy_equals_plain_for_128_tokens(smollm2):
    """Prompt lookup's greedy output is the plain greedy output, and it does accept drafts."""
    prompt = (
        "Repeat this list exactly, then add one more item: apples, pears, plums, cherries, "
        "grapes, lemons, oranges, figs, dates, kiwis."
    )
    ids = encode_prompt(smollm2.tokenizer, prompt)
    config = DecodeConfig(k=4, schedule="constant", max_new_tokens=128)
    plain = list(generate(smollm2, ids, config))
    spec = list(generate(smollm2, ids, config, PromptLookupDrafter()))
    kept = [e.token_id for e in spec if isinstance(e, TokenEvent) and e.state.kept]
    assert kept == [e.token_id for e in plain if isinstance(e, TokenEvent)]
    assert spec[-1].text == plain[-1].text
    assert spec[-1].accepted > 0


def test_layer_skip_greedy_equals_plain_on_the_builtin_target(smollm2):
    """The built-in target drafting with its own first 25 layers writes plain greedy text, and some
    of those drafts pass."""
    from specdeck.engine.drafting.layer_skip import LayerSkipDrafter, choose_layers

    ids = encode_prompt(smollm2.tokenizer, "Name three rivers in Europe and the seas they flow into.")
    config = DecodeConfig(k=3, schedule="constant", max_new_tokens=48)
    plain = [e.token_id for e in generate(smollm2, ids, config) if isinstance(e, TokenEvent)]
    spec = list(generate(smollm2, ids, config, LayerSkipDrafter(smollm2.model, choose_layers(smollm2, 25))))
    assert [e.token_id for e in spec if isinstance(e, TokenEvent) and e.state.kept] == plain
    assert spec[-1].accepted > 0


def test_chat_template_is_applied(smollm2):
    """Prompts go through the chat template unless raw completion is asked for."""
    chat = smollm2.tokenizer.decode(encode_prompt(smollm2.tokenizer, "Hello"))
    raw = smollm2.tokenizer.decode(encode_prompt(smollm2.tokenizer, "Hello", chat=False))
    assert "<|im_start|>user" in chat and chat.rstrip().endswith("assistant")
    assert "<|im_start|>" not in raw


def test_builtin_draft_ships_small_matches_and_keeps_greedy_exact(smollm2):
    """The bundled draft fits the size limit, shares the built-in target's vocabulary, proposes from
    its reduced vocabulary, and leaves greedy output unchanged while
    actually getting drafts accepted."""
    from specdeck.engine.drafting.vocabulary import match_vocabularies
    from specdeck.engine.loading.models import locate
    from specdeck.engine.loading.registry import DEFAULT_DRAFT

    folder = Path(locate(DEFAULT_DRAFT))
    assert sum(f.stat().st_size for f in folder.glob("*.safetensors")) <= 32_000_000
    assert (folder / "README.md").is_file()  # the model card
    draft = load_model(DEFAULT_DRAFT, ON_CPU)
    assert match_vocabularies(smollm2, draft).same
    assert draft.output_ids is not None and len(draft.output_ids) < smollm2.vocab_width
    ids = encode_prompt(smollm2.tokenizer, "Explain in simple terms why the sky is blue.")
    config = DecodeConfig(k=1, schedule="constant", lookup=0, max_new_tokens=64)
    plain = [e.token_id for e in generate(smollm2, ids, config) if isinstance(e, TokenEvent)]
    spec = list(generate(smollm2, ids, config, DraftModelDrafter(draft.model, output_ids=draft.output_ids)))
    assert [e.token_id for e in spec if isinstance(e, TokenEvent) and e.state.kept] == plain
    assert spec[-1].accepted >= 0.15 * spec[-1].drafted  # an untrained draft of this shape accepts ~0


def test_builtin_head_ships_small_and_keeps_greedy_exact(smollm2):
    """The bundled feature head fits the size limit, carries its card, binds to the built-in target
    and leaves greedy output unchanged while getting drafts accepted."""
    from specdeck.engine.drafting.heads import load_feature_head
    from specdeck.engine.loading.models import locate
    from specdeck.engine.loading.registry import DEFAULT_HEAD

    folder = Path(locate(DEFAULT_HEAD))
    assert sum(f.stat().st_size for f in folder.iterdir()) <= 32_000_000
    assert (folder / "README.md").is_file()
    head = load_feature_head(DEFAULT_HEAD, smollm2)
    assert head.output_ids is not None and len(head.output_ids) < smollm2.vocab_width
    ids = encode_prompt(smollm2.tokenizer, "Explain in simple terms why the sky is blue.")
    config = DecodeConfig(k=1, schedule="constant", lookup=0, max_new_tokens=64)
    summary = head_session_keeps_plain_text(smollm2, head, ids, config)
    assert summary.accepted >= 0.15 * summary.drafted  # an untrained head accepts ~0


def test_default_pair_copies_from_an_article_and_stays_exact(smollm2):
    """The default settings (head, K=1, prompt lookup first) on the summarization preset: some copies
    of the article are accepted, and the text equals plain greedy decoding."""
    from specdeck.engine.drafting.heads import load_feature_head
    from specdeck.engine.loading.registry import DEFAULT_HEAD
    from specdeck.engine.resources import resource_path

    head = load_feature_head(DEFAULT_HEAD, smollm2)
    prompt = resource_path("presets", "summarization.txt").read_text(encoding="utf-8")
    ids = encode_prompt(smollm2.tokenizer, prompt)
    config = DecodeConfig(max_new_tokens=48)
    assert config.lookup > 0
    summary = head_session_keeps_plain_text(smollm2, head, ids, config)
    assert summary.copied_accepted > 0 and summary.accepted > summary.copied_accepted


def test_default_pair_is_the_builtin_target_with_its_head(tiny_llama):
    """With nothing chosen the built-in target comes with its feature head on torch (the faster of
    its two drafters, README "Feature heads") and with the suffix drafter on llama.cpp, where only
    long copies pay (a head asked for there is the one on the last state alone); with its distilled draft when that drafter is
    asked for; the head by itself when named; prompt lookup when asked for it; a target of one's own
    without a draft gets prompt lookup."""
    from specdeck.engine.forward.llamacpp_backend import library
    from specdeck.engine.loading.registry import DEFAULT_DRAFT, DEFAULT_HEAD, DEFAULT_TARGET, LAST_STATE_HEAD
    from specdeck.engine.pair import PairSpec
    from specdeck.engine.session import load_pair

    pair = load_pair(PairSpec(device="cpu", backend="torch"))
    assert (pair.target.name, pair.drafter_kind, pair.head.name) == (DEFAULT_TARGET, "feature-head", DEFAULT_HEAD)
    if library() is not None:
        assert load_pair(PairSpec(backend="llama.cpp")).drafter_kind == "suffix"
        assert load_pair(PairSpec(backend="llama.cpp", drafter="feature-head")).head.name == LAST_STATE_HEAD
    assert load_pair(PairSpec(drafter="draft-model", device="cpu")).draft_model.name == DEFAULT_DRAFT
    assert load_pair(PairSpec(draft=DEFAULT_HEAD, device="cpu")).drafter_kind == "feature-head"
    assert load_pair(PairSpec(drafter="prompt-lookup", device="cpu")).draft_model is None
    own = load_pair(PairSpec(tiny_llama[0].name, device="cpu"))
    assert own.drafter_kind == "prompt-lookup" and own.draft_model is None


def test_lean_forward_keeps_hf_logits_and_greedy_text(monkeypatch):
    """The built-in target runs on the lean Llama forward, whose logits equal Hugging Face's
    forward after a prefill, steps, a verify chunk and a crop, and whose plain greedy text is
    Hugging Face generate()'s, with its rows in float32 (in 8 bits, `test_gguf_blocks`, they are
    another arithmetic)."""
    import torch

    from specdeck.engine.forward.kvcache import CachedModel, HFForward
    from specdeck.engine.forward.llama_forward import LlamaForward

    monkeypatch.setenv("SPECDECK_GGUF_BLOCKS", "float32")
    smollm2 = load_model("smollm2-135m-instruct", ON_CPU)

    assert isinstance(CachedModel(smollm2.model).backend, LlamaForward)
    ids = encode_prompt(smollm2.tokenizer, "Summarize: the cat sat on the mat because the mat was warm.")
    fast, hf = LlamaForward(smollm2.model), HFForward(smollm2.model)
    with torch.inference_mode():
        for tokens in (ids[:-1], ids[-1:], [330, 2017], [28, 29, 30, 31]):
            # float32 rounding of another matrix-product kernel (engine.linear): logits of 10-30 agree
            # to about 1e-5 relative
            torch.testing.assert_close(
                fast.logits(torch.tensor(tokens), False), hf.logits(torch.tensor(tokens), False), rtol=1e-5, atol=2e-4
            )
            fast.crop(len(fast) - 1)
            hf.crop(len(hf) - 1)
        out = smollm2.model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=48,
            do_sample=False,
            pad_token_id=smollm2.tokenizer.eos_token_id,
        )
    ours = list(generate(smollm2, ids, DecodeConfig(max_new_tokens=48)))
    expected = smollm2.tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)
    assert ours[-1].text == expected
