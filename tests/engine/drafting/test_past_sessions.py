"""Suffix scope and sources: what a suffix drafter reads under each scope, the past sessions kept in
the cache folder (round trip, size cap, clearing), and where each copied token says it came from."""

import csv
import dataclasses
import io

import pytest

from specdeck.engine import DecodeConfig, PromptLookupDrafter, RoundEvent, TokenEvent, encode_prompt, generate
from specdeck.engine.cache import clear_suffix_texts, suffix_cache
from specdeck.engine.drafting.past_sessions import PastSessions, read_texts
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.export import SessionRecord, tokens_csv
from specdeck.engine.pair import DrafterKind, ModelPair

PROMPT = "The quick brown fox"


@pytest.fixture(autouse=True)
def cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def session(pair: ModelPair, scope: str, prompt: str = PROMPT, max_new_tokens: int = 32) -> list:
    ids = encode_prompt(pair.target.tokenizer, prompt, chat=False)
    config = DecodeConfig(k=6, schedule="constant", max_new_tokens=max_new_tokens, suffix_scope=scope)
    return list(generate(pair.target, ids, config, pair.make_drafter()))


def accepted_sources(events) -> set[str]:
    return {e.source for e in events if isinstance(e, TokenEvent) and e.state.value == "accepted"}


def test_scope_all_keeps_answers_for_later_sessions(tiny_pair):
    """An answer written under scope `all` is read by a later SpecDeck session (a new pair, as after
    a restart) under scope `all` and labelled "past"; under scope `session` the new pair reads none of it."""
    target, _ = tiny_pair
    first = session(ModelPair(target, drafter_kind=DrafterKind.SUFFIX), "all")
    assert len(list(suffix_cache().glob("*.tokens"))) == 1
    fresh = session(ModelPair(target, drafter_kind=DrafterKind.SUFFIX), "session")
    later = session(ModelPair(target, drafter_kind=DrafterKind.SUFFIX), "all")
    assert first[-1].text == fresh[-1].text == later[-1].text
    assert later[-1].accepted > fresh[-1].accepted
    assert "past" in accepted_sources(later)
    assert "past" not in accepted_sources(fresh)


def test_scope_session_and_prompt_leave_the_cache_folder_alone(tiny_pair):
    """Under scopes `session` and `prompt` nothing is written to the cache folder."""
    target, _ = tiny_pair
    pair = ModelPair(target, drafter_kind=DrafterKind.SUFFIX)
    session(pair, "session")
    session(pair, "prompt")
    assert not suffix_cache().exists()


def test_a_second_answer_copies_from_the_first_as_session(tiny_pair):
    """Asked again in the same session, the copies come from the earlier answer ("session"); the
    first time only from the request's own text ("prompt")."""
    target, _ = tiny_pair
    pair = ModelPair(target, drafter_kind=DrafterKind.SUFFIX)
    first, second = session(pair, "session"), session(pair, "session")
    assert accepted_sources(first) <= {"prompt"}
    assert "session" in accepted_sources(second)
    rounds = [e for e in second if isinstance(e, RoundEvent) and e.drafted]
    assert rounds and all(r.match_length > 0 for r in rounds)


def test_tokens_csv_names_each_copied_tokens_source(tiny_pair):
    """The tokens CSV has a source column: filled for copied drafts, empty for the target's own tokens."""
    target, _ = tiny_pair
    pair = ModelPair(target, drafter_kind=DrafterKind.SUFFIX)
    session(pair, "session")
    record = SessionRecord(1, "speculative")
    for event in session(pair, "session"):
        record.add(event)
    rows = list(csv.reader(io.StringIO(tokens_csv([record]))))
    source, state = rows[0].index("source"), rows[0].index("state")
    by_state = {}
    for row in rows[1:]:
        by_state.setdefault(row[state], set()).add(row[source])
    assert "session" in by_state["accepted"]
    assert by_state.get("bonus", {""}) | by_state.get("resampled", {""}) == {""}


def test_prompt_lookup_copies_say_prompt(tiny_llama):
    """Prompt lookup copies from the request's own text: its accepted drafts say "prompt"."""
    target, _ = tiny_llama
    ids = encode_prompt(target.tokenizer, "The quick brown fox jumps over the lazy dog. The quick brown", chat=False)
    events = list(
        generate(target, ids, DecodeConfig(k=4, schedule="constant", max_new_tokens=24), PromptLookupDrafter())
    )
    drafted = [e for e in events if isinstance(e, TokenEvent) and e.state.value in ("accepted", "rejected")]
    assert drafted and {e.source for e in drafted} == {"prompt"}


def test_store_round_trip_cap_and_clear(tiny_pair):
    """Saved texts read back in order; past the cap the oldest go first; a damaged file reads as
    empty and is replaced by the next save; clearing removes the file."""
    target, _ = tiny_pair
    store = PastSessions(target.tokenizer, max_tokens=10)
    store.save([1, 2, 3, 4])
    store.save([5, 6, 7])
    assert read_texts(store.path) == [[1, 2, 3, 4], [5, 6, 7]]
    store.save([8, 9, 10, 11])
    assert read_texts(store.path) == [[5, 6, 7], [8, 9, 10, 11]]
    store.path.write_bytes(b"not a store")
    assert read_texts(store.path) == []
    store.save([12])
    assert read_texts(store.path) == [[12]]
    assert clear_suffix_texts() == 1
    assert not store.path.exists()


def test_a_damaged_text_in_the_store_is_left_out_and_the_session_runs(tiny_pair):
    """A stored text holding an id no token has (a damaged byte) is left out when the store is read:
    a session under scope all runs and keeps plain greedy text, and the next save drops that text."""
    from specdeck.engine.drafting.past_sessions import encode_texts

    target, _ = tiny_pair
    pair = ModelPair(target, drafter_kind=DrafterKind.SUFFIX)
    prompt = encode_prompt(target.tokenizer, PROMPT, False)
    plain = [e.token_id for e in generate(target, prompt, DecodeConfig(max_new_tokens=32)) if isinstance(e, TokenEvent)]
    damaged = prompt + plain[:3] + [2_000_000_000] + plain[4:]
    store = PastSessions(target.tokenizer)
    store.path.parent.mkdir(parents=True, exist_ok=True)
    store.path.write_bytes(encode_texts([damaged, [5, 6, 7]]))
    events = session(pair, "all")
    assert [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept][: len(plain)] == plain
    assert [5, 6, 7] in read_texts(store.path) and damaged not in read_texts(store.path)


def test_unknown_scope_is_refused():
    """A scope other than prompt, session or all is refused with the choices named."""
    with pytest.raises(SpecDeckError, match="prompt .* session .* all"):
        DecodeConfig(suffix_scope="everything")


def test_the_targets_own_texts_are_copied_under_scope_session(tiny_pair, monkeypatch, tmp_path):
    """`specdeck suffix-texts` has the target answer composed requests and keeps the answers where
    the suffix drafter reads them: a later session under scope `session` copies from them (labelled
    "texts") and keeps more drafts than without them, with the same text; scope `prompt` ignores them.
    A rerun resumes after the answers already made."""
    from specdeck.train import target_texts

    target, _ = tiny_pair
    without = session(ModelPair(target, drafter_kind=DrafterKind.SUFFIX), "session")
    asked = [PROMPT, "jumps over", "the lazy dog"]
    monkeypatch.setattr(target_texts, "requests", lambda seed=0: asked)
    monkeypatch.setattr(
        target_texts, "chat_ids", lambda target, text: encode_prompt(target.tokenizer, text, chat=False)
    )
    folder = tmp_path / "work"
    config = target_texts.TextsConfig(tokens=1, answer_tokens=32, backend="torch")
    first = target_texts.grow(target.name, folder, config, progress=lambda line: None)
    assert len(first) == 1  # one answer reaches one token
    answers = target_texts.grow(
        target.name, folder, dataclasses.replace(config, tokens=10**6), progress=lambda line: None
    )
    assert len(answers) == len(asked) and answers[0] == first[0]
    path = target_texts.write_texts(answers, target.tokenizer, tmp_path / "cache" / "target-texts")
    assert read_texts(path) == [a for a in answers if a]

    pair = ModelPair(target, drafter_kind=DrafterKind.SUFFIX)
    with_texts = session(pair, "session")
    assert with_texts[-1].text == without[-1].text
    assert "texts" in accepted_sources(with_texts)
    assert with_texts[-1].accepted > without[-1].accepted
    assert "texts" not in accepted_sources(session(pair, "prompt"))


def test_the_built_in_target_ships_its_own_texts():
    """SpecDeck ships the built-in target's own texts, where a suffix drafter for it finds them."""
    from specdeck.engine.drafting.past_sessions import target_texts_file
    from specdeck.engine.loading.models import load_tokenizer
    from specdeck.engine.loading.registry import DEFAULT_TARGET
    from specdeck.engine.resources import resource_path

    tokenizer = load_tokenizer(DEFAULT_TARGET)
    store = PastSessions(tokenizer)
    path = target_texts_file(store.path.stem)
    assert path is not None and path == resource_path("texts", path.name)
    texts = read_texts(path)
    assert sum(map(len, texts)) >= 100_000
    assert all(0 <= token < len(tokenizer) for text in texts for token in text)
    assert store.target_texts() is not None
