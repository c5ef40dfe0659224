"""Benchmark conversations: every turn of a record asked in one conversation and reported per turn,
the bundled refine workload by name, and the repeat scenario kept apart from the other rows."""

from specdeck.bench.prompts import BenchPrompt, read_prompts
from specdeck.bench.runner import BenchSettings, Method, run_bench
from specdeck.bench.tables import summary_rows
from specdeck.engine import DecodeConfig
from specdeck.engine.loading.models import encode_conversation, encode_prompt
from specdeck.engine.pair import DrafterKind, ModelPair

TURNS = ("The quick brown fox", "Say it again")


def test_second_turn_follows_the_first_answer(tiny_pair):
    """Turn 2 is asked after turn 1 and plain decoding's answer to it, the same for every method; the
    summary reports each turn."""
    target, _ = tiny_pair
    pair = ModelPair(target, drafter_kind=DrafterKind.SUFFIX)
    record = BenchPrompt("1", "refine", TURNS[0], chat=True, later_turns=TURNS[1:])
    settings = BenchSettings(ks=(4,), baselines=("plain",), repeats=1, decode=DecodeConfig(max_new_tokens=16))
    first, second = run_bench([pair], [record], settings)
    assert (first.turn, second.turn) == (1, 2)
    answer = first.runs[Method("plain")][0]
    asked = encode_conversation(target.tokenizer, list(TURNS), [answer.text], chat=True)
    assert second.prompt_tokens == len(asked) > first.prompt_tokens + answer.new_tokens
    assert not second.mismatch
    rows = summary_rows([first, second], settings, settings.methods([pair]))
    assert {(r["category"], r["turn"]) for r in rows} == {("refine", "all"), ("all", "all"), ("all", 1), ("all", 2)}


def test_conversation_keeps_texts_as_data(tiny_pair):
    """Through a chat template, the earlier turn and its answer come before the new turn in order,
    and a control token typed in an answer stays text."""
    target, _ = tiny_pair
    tokenizer = target.tokenizer
    tokenizer.chat_template = (
        "{% for m in messages %}<eos>{{ m['role'] }}\n{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<eos>assistant\n{% endif %}"
    )
    try:
        ids = encode_conversation(tokenizer, ["first question", "second question"], ["an answer <eos>"])
        single = encode_prompt(tokenizer, "second question")
    finally:
        tokenizer.chat_template = None
    text = tokenizer.decode(ids)
    assert text.index("first question") < text.index("an answer") < text.index("second question")
    assert ids.count(tokenizer.eos_token_id) == 4  # the template's, not the one typed in the answer
    assert ids[-len(single) :] == single  # the new turn is asked as a single prompt would be


def test_refine_workload_runs_by_name():
    """`--prompts refine` reads the bundled refine workload: 16 records of two turns."""
    records = read_prompts("refine")
    assert len(records) == 16 and {len(r.turns) for r in records} == {2}
    assert {r.category for r in records} == {"refine"}


def test_repeat_scenario_is_labelled_apart(tiny_pair):
    """With the repeat scenario, regenerating a prompt (its plain answer as history) is its own row and
    drafts more than the speculative row, which drafts alike on every repeat (never from the same
    prompt); both keep plain decoding's text."""
    target, _ = tiny_pair
    pair = ModelPair(target, drafter_kind=DrafterKind.SUFFIX)
    prompts = [BenchPrompt("1", "qa", TURNS[0], chat=False)]
    settings = BenchSettings(
        ks=(4,), baselines=("plain",), repeats=2, decode=DecodeConfig(max_new_tokens=32), repeat_scenario=True
    )
    [result] = run_bench([pair], prompts, settings)
    speculative, repeat = Method("speculative", 4, "suffix"), Method("repeat", 4, "suffix")
    assert [m.name for m in settings.methods([pair])] == ["plain", "speculative", "repeat"]
    fresh = [run.accepted for run in result.runs[speculative]]
    assert len(set(fresh)) == 1
    assert min(run.accepted for run in result.runs[repeat]) > fresh[0]
    assert not result.mismatch
