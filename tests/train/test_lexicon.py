"""Requests composed from WordNet's everyday nouns (`specdeck.train.lexicon`): the wide part of the
requests a feature head's own answers follow."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from specdeck.bench.prompts import prompts_path, read_prompts
from specdeck.train import lexicon
from specdeck.train.lexicon import KINDS, lexicon_requests, read_lexicon

# a few synsets in WordNet's own format: offset, file, part, word count (hex), words with their
# lex ids, pointer count, pointers (symbol, offset, part, source/target), then the gloss
DATA_NOUN = """\
  1 This software and database is provided by Princeton University
00000010 05 n 01 animal 0 000 | a living organism that feeds on organic matter
00000020 05 n 01 dog 0 001 @ 00000010 n 0000 | a domesticated canid; "the dog barked all night long"
00000030 05 n 01 cat 0 001 @ 00000010 n 0000 | feline mammal kept as a pet; "the cat sat on the warm mat"
00000040 05 n 01 horse 0 001 @ 00000010 n 0000 | a large hoofed mammal
00000050 17 n 01 bank 1 000 | a slope beside a body of water
00000060 18 n 01 baker 0 000 | someone who bakes bread or cake
00000070 04 n 01 gardening 0 000 | the cultivation of plants; "she spends her weekends on gardening and reading"
00000080 09 n 01 memory 0 000 | the power of retaining and recalling past experience
00000090 15 n 01 harbor 0 000 | a sheltered port where ships can take on cargo
00000100 14 n 01 orchestra 0 000 | a musical organization of many players
00000110 09 n 01 science 0 000 | a particular branch of scientific knowledge
00000120 09 n 01 natural_science 0 001 @ 00000110 n 0000 | the sciences of the physical world
00000130 09 n 01 physics 0 001 @ 00000120 n 0000 | the science of matter and energy
00000140 19 n 01 inertia 0 001 ;c 00000130 n 0000 | the tendency of a body to keep its state of motion
00000150 07 n 01 wave_number 0 001 ;c 00000130 n 0000 | the reciprocal of a wavelength
00000160 04 n 01 baseball 0 000 | a ball game played by two teams of nine players
00000170 04 n 01 bunt 0 001 ;c 00000160 n 0000 | a ball tapped lightly within the infield
"""
CNTLIST = """\
animal%1:05:00:: 1 20
dog%1:05:00:: 1 12
cat%1:05:00:: 1 9
horse%1:05:00:: 1 4
bank%1:17:01:: 2 3
baker%1:18:00:: 1 2
gardening%1:04:00:: 1 2
memory%1:09:00:: 1 8
harbor%1:15:00:: 1 3
orchestra%1:14:00:: 1 2
"""


@pytest.fixture
def wordnet(tmp_path) -> Path:
    (tmp_path / "data.noun").write_text(DATA_NOUN, encoding="utf-8")
    (tmp_path / "cntlist.rev").write_text(CNTLIST, encoding="utf-8")
    return tmp_path


def test_everyday_first_senses_are_kept_by_kind_and_kinds_of_one_thing_paired(wordnet):
    """A noun is kept where the tagged corpus counts it as its word's first sense, in its group;
    nouns under one parent pair up; whole example sentences are kept as sentences."""
    lex = read_lexicon(wordnet)
    assert sorted(lex.nouns["thing"]) == ["animal", "cat", "dog", "horse"]  # "bank" is a second sense
    assert lex.nouns["person"] == ["baker"] and lex.nouns["activity"] == ["gardening"]
    assert {(a, b) for a, b, kind in lex.pairs} == {("dog", "cat"), ("cat", "horse")}
    assert {kind for *_, kind in lex.pairs} == {"animal"}
    assert "the dog barked all night long" in lex.sentences


def test_technical_terms_are_those_of_a_science_with_their_field(wordnet):
    """A noun in the topic domain of a science (or of a field below one) is a technical term of that
    field, counted by the tagged corpus or not; one in a game's domain is not."""
    lex = read_lexicon(wordnet)
    assert sorted(lex.terms) == [("inertia", "physics"), ("wave number", "physics")]
    asked = lexicon_requests(300, seed=1, lexicon=lex)
    assert any("inertia" in r and "physics" in r for r in asked)
    assert not any("bunt" in r for r in asked)


def test_requests_are_distinct_repeatable_and_of_every_kind_in_its_share(wordnet, monkeypatch):
    """Every kind of request is asked about as often as its weight says, none twice, and the same
    seed composes the same list."""
    made = Counter()

    def counted(compose):
        def kind(lex, rng):
            made[compose.__name__] += 1
            return compose(lex, rng)

        kind.__name__ = compose.__name__
        return kind

    monkeypatch.setattr(lexicon, "KINDS", [(weight, counted(compose)) for weight, compose in KINDS])
    lex = read_lexicon(wordnet)
    asked = lexicon_requests(1500, seed=3, lexicon=lex)
    assert len(asked) == len(set(asked)) == 1500
    total = sum(weight for weight, _ in KINDS)
    for weight, compose in KINDS:
        share = made[compose.__name__] / sum(made.values())
        assert 0.5 * weight / total < share < 1.5 * weight / total, (compose.__name__, share)
    assert lexicon_requests(1500, seed=3, lexicon=lex) == asked
    assert lexicon_requests(1500, seed=4, lexicon=lex) != asked


def test_without_wordnet_nothing_is_composed(tmp_path, monkeypatch):
    """A machine without WordNet's files composes no request, and says so by returning none."""
    monkeypatch.setattr(lexicon, "WORDNET", tmp_path)
    assert read_lexicon() is None
    assert lexicon_requests(100) == []


def _shingles(text: str, n: int = 8) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def test_no_request_quotes_a_benchmark_prompt():
    """No eight words in a row of a composed request come from the benchmark prompts, bundled or
    beside the checkout: a head trained on the answers is measured on those prompts."""
    if read_lexicon() is None:
        pytest.skip("WordNet (Debian's wordnet-base) is not installed here")
    files = [prompts_path("spec-bench"), prompts_path("humaneval")]
    files += sorted((Path(__file__).parents[3] / ".." / "shared" / "bench").glob("*.jsonl"))
    benchmark = set().union(*(_shingles(" ".join(p.turns)) for path in files for p in read_prompts(path)))
    composed = lexicon_requests(40_000)
    assert len(composed) == 40_000
    quoted = [r for r in composed if _shingles(r) & benchmark]
    assert not quoted, quoted[:3]
