"""Every answer of a served target is checked against what was sent (`specdeck.engine.remote.remote_answers`):
well-formed answers, drawn by hypothesis, are read as they were written, and mutations of them (an
entry more or less, shifted positions, wrong types, NaN, ids outside the vocabulary, a missing
field) are refused with a message naming the server and what was wrong. A scripted server on
127.0.0.1 gives the answers. SPECDECK_HYPOTHESIS=long draws many more."""

from __future__ import annotations

import copy
import math
import os
import random
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from serving import FakeServer, QuietHandler

from specdeck.engine.config import DecodeConfig
from specdeck.engine.drafting.drafters import PromptLookupDrafter
from specdeck.engine.events import SummaryEvent, TokenEvent
from specdeck.engine.loading.models import load_tokenizer
from specdeck.engine.loading.registry import DEFAULT_TARGET
from specdeck.engine.loop.decoding import generate
from specdeck.engine.remote.remote_http import Endpoint, ServerFault
from specdeck.engine.remote.remote_scoring import EchoScoring, SglangScoring, VllmScoring
from specdeck.engine.remote.remote_target import RemoteSettings, connect

LONG = os.environ.get("SPECDECK_HYPOTHESIS") == "long"
PROFILE = settings(
    max_examples=600 if LONG else 60,
    deadline=None,
    derandomize=not LONG,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class Scripted(FakeServer):
    """A server on a free port of 127.0.0.1 that answers each request with `answer(path, body)`."""

    def __init__(self) -> None:
        scripted = self
        self.answer = lambda path, body: {}

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                self.reply(scripted.answer(self.path, None))

            def do_POST(self) -> None:
                body = self.body()
                self.reply(scripted.answer(self.path, body))

        super().__init__(Handler)

    def serve(self, answer: dict) -> Endpoint:
        """An endpoint on this server, which now gives `answer` to every request."""
        self.answer = lambda path, body: answer
        return Endpoint(self.url, 5.0)


@pytest.fixture(scope="module")
def served():
    with Scripted() as scripted:
        yield scripted


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(DEFAULT_TARGET)


@dataclass
class Case:
    """A request (the kept tokens and the drafts, the vocabulary and top-k asked), a well-formed
    answer to it, and the rows that answer means."""

    vocab: int
    top: int
    ids: list[int]
    drafts: list[int]
    answer: dict
    rows: list[dict[int, float]]


logprobs = st.floats(-30.0, 0.0)


@st.composite
def listed(draw, vocab: int, top: int, must: int | None = None, avoid: int | None = None) -> dict[int, float]:
    """A position's listed tokens: up to `top` drawn ones, and `must` (its own token) among them;
    never `avoid` (the next position's token, so that a shifted entry cannot pass by chance)."""
    tokens = draw(
        st.lists(st.integers(0, vocab - 1).filter(lambda t: t not in (must, avoid)), max_size=top, unique=True)
    )
    if must is None and not tokens:
        tokens = [draw(st.integers(0, vocab - 1).filter(lambda t: t != avoid))]
    tokens = tokens + ([must] if must is not None else [])
    return {t: draw(logprobs) for t in tokens}


@st.composite
def requests(draw, min_prompt: int = 2) -> tuple[int, int, list[int], list[int]]:
    vocab, top = draw(st.integers(8, 5000)), draw(st.integers(1, 5))
    prompt = draw(st.lists(st.integers(0, vocab - 1), min_size=min_prompt, max_size=12))
    kept = draw(st.integers(1, len(prompt)))
    return vocab, top, prompt[:kept], prompt[kept:]


@st.composite
def vllm_cases(draw) -> Case:
    vocab, top, ids, drafts = draw(requests())
    prompt = ids + drafts
    entries = [
        draw(listed(vocab, top, must=prompt[j], avoid=prompt[j + 1] if j + 1 < len(prompt) else None))
        for j in range(1, len(prompt))
    ]
    last = draw(listed(vocab, top))
    answer = {
        "id": "cmpl-1",
        "object": "text_completion",
        "choices": [
            {
                "index": 0,
                "text": "",
                "prompt_logprobs": [None]
                + [
                    {str(t): {"logprob": lp, "rank": 1, "decoded_token": f"token_id:{t}"} for t, lp in e.items()}
                    for e in entries
                ],
                "logprobs": {
                    "tokens": ["token_id:0"],
                    "top_logprobs": [{f"token_id:{t}": lp for t, lp in last.items()}],
                },
            }
        ],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": 1, "prompt_tokens_details": None},
    }
    return Case(vocab, top, ids, drafts, answer, [*entries[len(ids) - 1 :], last])


def _entry(answer: dict, data, least: int = 1) -> dict:
    """A prompt_logprobs entry of a vLLM answer, drawn."""
    entries = answer["choices"][0]["prompt_logprobs"]
    return entries[data.draw(st.integers(least, len(entries) - 1))] if len(entries) > least else None


def _vllm_extra_leading(answer, case, data):
    answer["choices"][0]["prompt_logprobs"].insert(0, None)
    return r"prompt_logprobs entries for a prompt of"


def _vllm_missing(answer, case, data):
    entries = answer["choices"][0]["prompt_logprobs"]
    del entries[data.draw(st.integers(0, len(entries) - 1))]
    return r"prompt_logprobs entries for a prompt of"


def _vllm_shifted(answer, case, data):
    """One extra leading entry, and the last one dropped: as many entries, each one place late."""
    prompt = case.ids + case.drafts
    assume(len(prompt) >= 3 and any(prompt[j - 1] != prompt[j] for j in range(2, len(prompt))))
    entries = answer["choices"][0]["prompt_logprobs"]
    entries.insert(1, copy.deepcopy(entries[1]))
    entries.pop()
    return r"does not name prompt token .*not at its position"


def _vllm_wrong_type(answer, case, data):
    entry = _entry(answer, data)
    assume(entry is not None)
    token = data.draw(st.sampled_from(sorted(entry)))
    entry[token]["logprob"] = data.draw(st.sampled_from(["-0.5", True, None, [-0.5]]))
    return r"logprob: Input should be a valid number"


def _vllm_not_finite(answer, case, data):
    entry = _entry(answer, data)
    assume(entry is not None)
    token = data.draw(st.sampled_from(sorted(entry)))
    entry[token]["logprob"] = data.draw(st.sampled_from([math.nan, math.inf, -math.inf, 0.5]))
    return r"not a finite number at or below 0.*bfloat16 or float32"


def _vllm_outside_vocabulary(answer, case, data):
    last = answer["choices"][0]["logprobs"]["top_logprobs"][0]
    last.pop(next(iter(last)))
    last[f"token_id:{case.vocab + data.draw(st.integers(0, 10**6))}"] = -1.0
    return rf"token id \d+ is outside SpecDeck's tokenizer \(ids 0 to {case.vocab - 1}\).*--tokenizer"


def _vllm_token_named_by_text(answer, case, data):
    last = answer["choices"][0]["logprobs"]["top_logprobs"][0]
    last[data.draw(st.sampled_from(["the", "token_id:-3", "token_id:", "7"]))] = -2.0
    return r"names a token .*not token_id:<id>"


def _vllm_too_many(answer, case, data):
    last = answer["choices"][0]["logprobs"]["top_logprobs"][0]
    free = [t for t in range(case.vocab) if f"token_id:{t}" not in last][: case.top + 1]
    assume(len(free) == case.top + 1)
    last.update({f"token_id:{t}": -5.0 for t in free})
    return r"top_logprobs\[0\] lists \d+ tokens where 1 to \d+ were asked"


def _vllm_missing_field(answer, case, data):
    choice = answer["choices"][0]
    field = data.draw(st.sampled_from(["prompt_logprobs", "logprobs", "choices"]))
    if field == "choices":
        answer["choices"] = []
    else:
        del choice[field]
    return r"Field required|at least 1 item"


VLLM_MUTATIONS = [
    _vllm_extra_leading,
    _vllm_missing,
    _vllm_shifted,
    _vllm_wrong_type,
    _vllm_not_finite,
    _vllm_outside_vocabulary,
    _vllm_token_named_by_text,
    _vllm_too_many,
    _vllm_missing_field,
]


@PROFILE
@given(case=vllm_cases())
def test_a_well_formed_vllm_answer_is_read_as_written(served, case):
    """Any well-formed vLLM answer gives the rows it holds: the drafts' positions, then after the prompt."""
    rows, _ = VllmScoring(case.top, case.vocab).score(
        served.serve(case.answer), "target", case.ids, case.drafts, len(case.drafts) + 1
    )
    assert rows == case.rows


@PROFILE
@given(case=vllm_cases(), mutation=st.sampled_from(VLLM_MUTATIONS), data=st.data())
def test_a_vllm_answer_not_as_sent_is_refused(served, case, mutation, data):
    """An answer with an entry more or less, shifted, of a wrong type, NaN, an id outside the
    vocabulary, more tokens than asked or a field missing is refused, naming the server and the fault."""
    answer = copy.deepcopy(case.answer)
    fault = mutation(answer, case, data)
    endpoint = served.serve(answer)
    with pytest.raises(ServerFault, match=rf"The server at {served.url} \(vLLM API\) answered /completions .*{fault}"):
        VllmScoring(case.top, case.vocab).score(endpoint, "target", case.ids, case.drafts, len(case.drafts) + 1)


@st.composite
def sglang_cases(draw) -> Case:
    vocab, top, ids, drafts = draw(requests())
    full = ids + drafts
    start = min(len(ids), len(full) - 1)
    entries = [None if j == 0 else draw(listed(vocab, top)) for j in range(start, len(full))]
    last = draw(listed(vocab, top))
    triples = lambda row: [[lp, t, None] if t % 2 else [lp, t] for t, lp in row.items()]  # noqa: E731
    meta = {
        "input_top_logprobs": [None if e is None else triples(e) for e in entries],
        "output_top_logprobs": [triples(last)],
        "input_token_logprobs": [[None if j == 0 else -1.0, full[j], None] for j in range(start, len(full))],
        "e2e_latency": 0.01,
    }
    rows = [e or {} for e in entries[len(ids) - start :]]
    return Case(vocab, top, ids, drafts, {"text": "", "meta_info": meta}, [*rows, last])


def _sglang_extra(answer, case, data):
    answer["meta_info"]["input_top_logprobs"].insert(0, None)
    return r"input_top_logprobs entries for the \d+ input tokens"


def _sglang_shifted(answer, case, data):
    named = answer["meta_info"]["input_token_logprobs"]
    named.insert(0, [-1.0, (named[0][1] + 1) % case.vocab, None])
    named.pop()
    return r"input_token_logprobs name other tokens than were sent"


def _sglang_wrong_type(answer, case, data):
    triple = data.draw(st.sampled_from(answer["meta_info"]["output_top_logprobs"][0]))
    triple[data.draw(st.integers(0, 1))] = data.draw(st.sampled_from(["1", None, 2.5, True]))
    return r"output_top_logprobs\[0\]\[\d+\]\[[01]\]: Input should be a valid"


def _sglang_outside_vocabulary(answer, case, data):
    answer["meta_info"]["output_top_logprobs"][0][0][1] = case.vocab + data.draw(st.integers(0, 10**6))
    return r"is outside SpecDeck's tokenizer"


def _sglang_not_finite(answer, case, data):
    answer["meta_info"]["output_top_logprobs"][0][0][0] = data.draw(st.sampled_from([math.nan, math.inf, 3.0]))
    return r"not a finite number at or below 0"


def _sglang_missing_field(answer, case, data):
    del answer["meta_info"][data.draw(st.sampled_from(["input_top_logprobs", "output_top_logprobs"]))]
    return r"Field required"


@PROFILE
@given(case=sglang_cases())
def test_a_well_formed_sglang_answer_is_read_as_written(served, case):
    """Any well-formed SGLang answer gives the rows it holds."""
    rows, _ = SglangScoring(case.top, case.vocab).score(
        served.serve(case.answer), "target", case.ids, case.drafts, len(case.drafts) + 1
    )
    assert rows == case.rows


@PROFILE
@given(
    case=sglang_cases(),
    mutation=st.sampled_from(
        [
            _sglang_extra,
            _sglang_shifted,
            _sglang_wrong_type,
            _sglang_outside_vocabulary,
            _sglang_not_finite,
            _sglang_missing_field,
        ]
    ),
    data=st.data(),
)
def test_an_sglang_answer_not_as_sent_is_refused(served, case, mutation, data):
    """An SGLang answer with an entry more, shifted tokens, wrong types, ids outside the vocabulary,
    NaN or a field missing is refused, naming the server and the fault."""
    answer = copy.deepcopy(case.answer)
    fault = mutation(answer, case, data)
    endpoint = served.serve(answer)
    with pytest.raises(ServerFault, match=rf"The server at {served.url} \(SGLang API\) answered /generate .*{fault}"):
        SglangScoring(case.top, case.vocab).score(endpoint, "target", case.ids, case.drafts, len(case.drafts) + 1)


@pytest.fixture(scope="module")
def echo(tokenizer):
    """llama-cpp-python's scoring, and tokens whose printed text names them alone (no BOS among them)."""
    scoring = EchoScoring(tokenizer, 5)
    alone = [
        ts[0] for text, ts in scoring.pieces().items() if len(ts) == 1 and text and ts[0] != tokenizer.bos_token_id
    ]
    return scoring, alone[:4000]


@st.composite
def echo_cases(draw, alone: list[int]) -> Case:
    tokens = st.sampled_from(alone)
    prompt = draw(st.lists(tokens, min_size=2, max_size=10))
    kept = draw(st.integers(1, len(prompt)))
    entries = [{t: draw(logprobs) for t in draw(st.lists(tokens, min_size=1, max_size=5, unique=True))} for _ in prompt]
    rows = entries[kept - 1 :]
    return Case(len(alone), 5, prompt[:kept], prompt[kept:], {}, rows)


def _echo_answer(case: Case, text) -> dict:
    entries = [{text([t]): lp for t, lp in row.items()} for row in case.rows]
    entries = [{"x": -1.0}] * (len(case.ids) - 1) + entries
    return {"choices": [{"text": "", "logprobs": {"top_logprobs": entries}}], "usage": {"completion_tokens": 1}}


def test_llama_cpp_answers_are_checked(served, echo):
    """Any well-formed echo answer of llama-cpp-python's server gives its rows; an entry more or
    less, NaN, a wrong type or more tokens than asked is refused, naming the server and the fault."""
    scoring, alone = echo
    pieces = {t: text for text, ts in scoring.pieces().items() for t in ts if t in set(alone)}
    text = lambda ids: pieces[ids[0]]  # noqa: E731

    def mutate(entries, how, data):
        if how == "extra":
            entries.insert(0, {"x": -1.0})
            return r"\d+ log-probability entries for \d+ tokens"
        if how == "missing":
            del entries[data.draw(st.integers(0, len(entries) - 1))]
            return r"\d+ log-probability entries for \d+ tokens"
        if how == "nan":
            entries[-1][next(iter(entries[-1]))] = math.nan
            return r"not a finite number at or below 0"
        if how == "type":
            entries[-1][next(iter(entries[-1]))] = "-1.5"
            return r"Input should be a valid number"
        entries[-1].update({f"extra{i}": -9.0 for i in range(6)})
        return r"lists \d+ tokens where 1 to 6 were asked"

    @PROFILE
    @given(case=echo_cases(alone), how=st.sampled_from(["extra", "missing", "nan", "type", "many"]), data=st.data())
    def check(case, how, data):
        answer = _echo_answer(case, text)
        rows, _ = scoring.score(served.serve(answer), "target", case.ids, case.drafts, len(case.drafts) + 1)
        assert rows == [{t: lp for t, lp in row.items()} for row in case.rows]
        fault = mutate(answer["choices"][0]["logprobs"]["top_logprobs"], how, data)
        with pytest.raises(
            ServerFault, match=rf"{served.url} \(llama-cpp-python API\) answered /completions .*{fault}"
        ):
            scoring.score(served.serve(answer), "target", case.ids, case.drafts, len(case.drafts) + 1)

    check()


@pytest.mark.parametrize(
    "answer, fault",
    [
        ({"tokens": ["12", 13]}, r"tokens\[0\]: Input should be a valid integer"),
        ({"tokens": [12, 10**9]}, r"tokens\[1\]: token id 1000000000 is outside SpecDeck's tokenizer"),
        ({"ids": [12]}, r"tokens: Field required"),
    ],
)
def test_a_tokenize_answer_not_of_ids_is_refused(served, echo, answer, fault):
    """llama-cpp-python's /extras/tokenize must answer token ids inside the vocabulary."""
    with pytest.raises(ServerFault, match=rf"{served.url} \(llama-cpp-python API\) answered /extras/tokenize.*{fault}"):
        echo[0].admit(served.serve(answer), [12, 13], [14])


@pytest.mark.parametrize(
    "answer, fault",
    [
        ({"object": "list"}, r"data: Field required"),
        ({"data": [{"id": 7, "owned_by": "vllm"}]}, r"data\[0\]\.id: Input should be a valid string"),
        ({"data": ["target"]}, r"data\[0\]: Input should be a valid dictionary"),
    ],
)
def test_a_models_list_not_as_the_api_gives_it_is_refused(served, tokenizer, answer, fault):
    """/v1/models must list models by their names: another shape is refused, naming the server."""
    served.serve(answer)
    with pytest.raises(ServerFault, match=rf"{served.url} \(OpenAI-compatible API\) answered /models.*{fault}"):
        connect(RemoteSettings(served.url, "target", 5.0), tokenizer)


def _fake_vllm(vocab: int, shift: int = 0):
    """A served "model" whose greedy next token repeats the prefix three tokens back, answered as
    vLLM does; `shift` entries of prompt_logprobs are put in front (the fault a vLLM build had)."""

    def row(prefix: list[int]) -> dict[int, float]:
        best = prefix[-3] if len(prefix) >= 3 else 100
        rest = random.Random(hash(tuple(prefix))).sample(range(100, vocab), 4)
        return {best: -0.05, **{t: -4.0 - i for i, t in enumerate(rest) if t != best}}

    def answer(path, body):
        if body is None:
            return {"object": "list", "data": [{"id": "target", "owned_by": "vllm"}]}
        prompt = body["prompt"]
        entries = [None] + [
            {str(t): {"logprob": lp} for t, lp in {prompt[j]: -1.0, **row(prompt[:j])}.items()}
            for j in range(1, len(prompt))
        ]
        entries = [None] * shift + entries[: len(entries) - shift] if shift else entries
        last = {f"token_id:{t}": lp for t, lp in row(prompt).items()}
        return {"choices": [{"prompt_logprobs": entries, "logprobs": {"top_logprobs": [last]}}]}

    return answer, lambda prefix: max(row(prefix).items(), key=lambda item: item[1])[0]


def test_speculative_text_against_a_vllm_is_its_greedy_text_and_a_shifted_answer_stops(served, tokenizer):
    """Against a served model answering as vLLM does to drafts scored as prompt, speculative greedy
    text is the model's own
    greedy text; the same model answering one entry late stops the session, saying so, instead of
    writing other text."""
    answer, greedy = _fake_vllm(len(tokenizer))
    served.answer = answer
    prompt = [200, 300, 400, 200, 300]
    target = connect(RemoteSettings(served.url, "target", 5.0, "score"), tokenizer)
    events = list(generate(target, prompt, DecodeConfig(k=3, max_new_tokens=12), PromptLookupDrafter()))
    written, plain = [e.token_id for e in events if isinstance(e, TokenEvent)], list(prompt)
    for _ in written:
        plain.append(greedy(plain))
    assert written == plain[len(prompt) :] and events[-1].accepted > 0

    served.answer = _fake_vllm(len(tokenizer), shift=1)[0]
    target = connect(RemoteSettings(served.url, "target", 5.0, "score"), tokenizer)
    seen = []
    with pytest.raises(ServerFault, match=r"\(vLLM API\) answered /completions .*prompt_logprobs\[1\] is empty"):
        seen.extend(generate(target, prompt, DecodeConfig(k=3, max_new_tokens=12), PromptLookupDrafter()))
    assert isinstance(seen[-1], SummaryEvent) and seen[-1].stop_reason == "server_error" and seen[-1].new_tokens == 0
