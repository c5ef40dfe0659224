"""A draft with a tokenizer of its own: greedy output equals plain greedy, sampling follows the
target (chi-square, with a control), and the events show both sides."""

import csv

import pytest
import torch
from sampling_checks import chi_square, chi_square_quantile, exact_two_token_distribution, sample_two_tokens
from tiny import write_two_prompts

from specdeck.cli.main import main
from specdeck.engine import DecodeConfig, RoundEvent, TokenEvent, encode_prompt, generate
from specdeck.engine.drafting.cross_vocab import CrossVocabularyDrafter
from specdeck.engine.drafting.proposals import Proposal
from specdeck.engine.drafting.vocabulary import TokenText, match_vocabularies

PROMPTS = [
    "The quick brown fox",
    "Café, naïve, façade, 東京, Zürich, 🙂 — Ωμέγα ≠ ✓",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Once   upon\t\ta time\n\n\n    there   was",
]
TEXTS = PROMPTS + ["", " ", "\n\n", "ab\xa0cd", "日本語のテキスト", "x" * 40, "    indented\tand\ttabbed  "]


@pytest.fixture(scope="module", params=["llama-target", "gpt2-target"])
def directed(request, cross_pair):
    """(target, draft) both ways round: a SentencePiece target with a byte-level draft, and back."""
    llama, gpt2 = cross_pair
    return (llama, gpt2) if request.param == "llama-target" else (gpt2, llama)


def kept_ids(events) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept]


def test_text_reads_back_in_either_tokenizer(cross_pair):
    """Each tokenizer spells any text, cut characters included, in tokens whose bytes are that text,
    and reads a prompt's start as it encodes and decodes it (start-of-text token, space before the
    first word)."""
    for model in cross_pair:
        text = TokenText(model.tokenizer)
        for sample in TEXTS:
            data = sample.encode()
            for cut in (data, data[:-1]):
                assert text.text([token for token, _ in text.encode(cut)]) == cut
                assert [end for _, end in text.encode(cut)] == sorted(end for _, end in text.encode(cut))
            if sample.strip():
                ids = model.tokenizer(sample)["input_ids"]
                decoded = model.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
                assert b"".join(text.starting(ids)) == decoded.encode()
                assert [token for token, _ in text.encode(data, at_start=True)] == ids


def test_twins_are_tokens_with_the_same_string(cross_pair):
    """' the' is a twin across '▁the' and 'Ġthe'; the pair is a case of different tokenizers, and
    the shared count is what a token-by-token comparison of the two vocabularies gives."""
    llama, gpt2 = cross_pair
    match = match_vocabularies(llama, gpt2)
    assert match.case == "different" and f"{match.shared:,} of the draft's" in match.describe()
    the = gpt2.tokenizer.convert_tokens_to_ids("Ġthe")
    assert llama.tokenizer.convert_ids_to_tokens(int(match.twins[the])) == "\u2581the"
    gpt2_text, llama_text = TokenText(gpt2.tokenizer), TokenText(llama.tokenizer)
    strings = {llama_text.pieces[i] for i in range(len(llama_text)) if i not in llama_text.special}
    expected = sum(1 for i in range(len(gpt2_text)) if i not in gpt2_text.special and gpt2_text.pieces[i] in strings)
    assert match.shared == expected
    assert match_vocabularies(llama, llama).case == "same"


def test_greedy_across_tokenizers_equals_plain(directed):
    """For K = 1..5 and prompts with Unicode, code and whitespace runs, greedy speculative decoding
    with a draft of another tokenizer keeps exactly plain greedy's tokens."""
    target, draft = directed
    match = match_vocabularies(target, draft)
    drafted = accepted = 0
    for prompt in PROMPTS:
        ids = encode_prompt(target.tokenizer, prompt, chat=False)
        plain = kept_ids(generate(target, ids, DecodeConfig(max_new_tokens=24)))
        for k in range(1, 6):
            config = DecodeConfig(k=k, schedule="constant", lookup=0, max_new_tokens=24)
            events = list(generate(target, ids, config, CrossVocabularyDrafter(draft.model, match)))
            assert kept_ids(events) == plain, (prompt, k)
            drafted += events[-1].drafted
            accepted += events[-1].accepted
    assert 0 < accepted < drafted  # both outcomes happened, so the identity means something


def test_drafts_are_mostly_kept_on_text_both_models_know(directed):
    """On text both models learned, most drafts read across the tokenizers are accepted: the
    draft follows the kept text round after round."""
    target, draft = directed
    ids = encode_prompt(target.tokenizer, PROMPTS[0], chat=False)
    config = DecodeConfig(k=3, schedule="constant", lookup=0, max_new_tokens=24)
    summary = list(
        generate(target, ids, config, CrossVocabularyDrafter(draft.model, match_vocabularies(target, draft)))
    )[-1]
    assert summary.acceptance_rate > 0.5


def test_events_keep_target_tokens_and_show_the_draft_s(directed):
    """Token events are in the target's tokens (their texts make the output); each drafted one also
    carries the draft's own tokens for it and their q, and each round counts the draft's tokens."""
    target, draft = directed
    ids = encode_prompt(target.tokenizer, PROMPTS[2], chat=False)
    for temperature in (0.0, 1.0):
        config = DecodeConfig(k=3, schedule="constant", lookup=0, max_new_tokens=24, temperature=temperature)
        events = list(
            generate(target, ids, config, CrossVocabularyDrafter(draft.model, match_vocabularies(target, draft)))
        )
        tokens = [e for e in events if isinstance(e, TokenEvent)]
        assert "".join(e.text for e in tokens if e.state.kept) == events[-1].text
        drafts = [e for e in tokens if e.depth]  # accepted, rejected and discarded drafts
        assert drafts and all(e.draft_tokens and len(e.draft_q) == len(e.draft_tokens) for e in drafts)
        assert all(0 <= q <= 1 for e in drafts for q in e.draft_q)
        assert all(not e.draft_tokens for e in tokens if e.depth == 0)
        rounds = [e for e in events if isinstance(e, RoundEvent)]
        assert sum(r.draft_tokens or 0 for r in rounds) >= 1
        if temperature:  # a sampled draft is the twin of the draft's token: the same string
            strings = TokenText(target.tokenizer)
            assert all(
                e.draft_tokens == (strings.text([e.token_id]).decode("utf-8", "backslashreplace"),)
                for e in drafts
                if e.token_id not in target.eos_ids
            )


# two new tokens leave room for one draft: the first token drafted, the second the target's own
SAMPLING = DecodeConfig(k=1, temperature=2.0, top_p=0.95, max_new_tokens=2, schedule="constant", lookup=0)
SAMPLED_PROMPT = "def add(a, b):\n   "


def test_sampling_across_tokenizers_follows_target(directed):
    """Over 1000 seeds, the first two tokens sampled with a draft of another tokenizer (drafting
    only tokens with a twin, q renormalised over them) follow the target exactly."""
    target, draft = directed
    match = match_vocabularies(target, draft)
    ids = encode_prompt(target.tokenizer, SAMPLED_PROMPT, chat=False)
    exact = exact_two_token_distribution(target, ids, SAMPLING)
    n = 1000
    counts, rejections = sample_two_tokens(target, ids, SAMPLING, lambda: CrossVocabularyDrafter(draft.model, match), n)
    assert 0.05 * n < rejections < 0.95 * n  # both branches of the rule were taken often
    stat, df = chi_square(counts, exact, n)
    assert df >= 5
    assert stat < chi_square_quantile(df)


def misplaced_q(match):
    """A drafter that drafts as it should but reports each q at the draft's own token ids instead of
    carrying it over to their twins in the target's vocabulary: wrong on purpose."""

    class MisplacedQDrafter(CrossVocabularyDrafter):
        def propose(self, ids, shape):
            proposal = super().propose(ids, shape)
            own = (match.twins >= 0).nonzero().flatten()
            own = own[own < self.vocab_width]
            q = torch.zeros_like(proposal.q)
            q[:, own] = proposal.q[:, match.twins[own]]
            return Proposal(proposal.tokens, q, pieces=proposal.pieces)

    return MisplacedQDrafter


def test_sampling_control_with_q_at_the_draft_s_ids_fails(directed):
    """The control: the same drafts judged with q left at the draft's own ids fail the same test."""
    target, draft = directed
    match = match_vocabularies(target, draft)
    ids = encode_prompt(target.tokenizer, SAMPLED_PROMPT, chat=False)
    exact = exact_two_token_distribution(target, ids, SAMPLING)
    n = 1000
    counts, _ = sample_two_tokens(target, ids, SAMPLING, lambda: misplaced_q(match)(draft.model, match), n)
    stat, df = chi_square(counts, exact, n)
    assert stat > chi_square_quantile(df)


def test_bench_times_hugging_face_universal_assisted_generation_beside(cross_pair, tmp_path):
    """`specdeck bench` with a draft of another tokenizer runs SpecDeck and Hugging Face's Universal
    Assisted Generation with the same pair and K in one run, both with plain decoding's text."""
    llama, gpt2 = cross_pair
    out = tmp_path / "out"
    code = main(
        [
            "bench",
            "--target",
            llama.name,
            "--draft",
            gpt2.name,
            "--prompts",
            str(write_two_prompts(tmp_path / "prompts.jsonl")),
            "--k",
            "2",
            "--lookup",
            "0",
            "--baselines",
            "plain,hf-assisted",
            "--repeats",
            "1",
            "--max-new-tokens",
            "12",
            "--no-plots",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    with (out / "per_prompt.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert {r["method"] for r in rows} == {"plain", "speculative", "hf-assisted"}
    assert all(r["identical_to_plain"] == "true" for r in rows), [r["mismatch"] for r in rows]
    assert "different tokenizers" in (out / "report.md").read_text(encoding="utf-8")


def test_pair_with_little_in_common_is_said_and_still_exact(cross_pair, tmp_path):
    """A draft whose tokens are whole words the target has no token for: the pair is "little in
    common", said with how little, and greedy decoding with it still equals plain decoding."""
    from tiny import CORPUS, ON_CPU, build_model
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from specdeck.engine.loading.models import load_model

    words = sorted({word for text in CORPUS for word in text.split()})
    tok = Tokenizer(models.WordLevel({word: i for i, word in enumerate(["[UNK]", "[EOS]", *words])}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[EOS]").save_pretrained(tmp_path)
    draft = load_model(str(build_model(tmp_path, "gpt2", len(words) + 2, seed=4, layers=1, eos_token_id=1)), ON_CPU)
    target = cross_pair[0]
    match = match_vocabularies(target, draft)
    assert match.case == "little" and "little in common: only" in match.describe()
    assert match.shared < 0.25 * len(words)
    ids = encode_prompt(target.tokenizer, PROMPTS[0], chat=False)
    config = DecodeConfig(k=3, schedule="constant", lookup=0, max_new_tokens=16)
    plain = kept_ids(generate(target, ids, DecodeConfig(max_new_tokens=16)))
    events = list(generate(target, ids, config, CrossVocabularyDrafter(draft.model, match)))
    assert kept_ids(events) == plain and events[-1].drafted > 0
