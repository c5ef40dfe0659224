"""A served target at a real context length: a round costs its new tokens, not the whole context.

Fake servers on 127.0.0.1 answer as vLLM and SGLang do, with a prefix cache kept as theirs is and
reported as theirs report it: vLLM counts cached prompt tokens in whole blocks and reads no cache
for a request with `prompt_logprobs` (vllm-project/vllm 23399); SGLang's radix cache reuses the
longest prefix it has seen, `logprob_start_len` included. The served "model" is a function of the
prefix, so the greedy text is known. The same properties against real servers: test_remote_target.py
(llama-cpp-python's) and test_remote_target_vllm.py."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from serving import FakeServer, QuietHandler

from specdeck.cli.run import format_summary
from specdeck.engine.config import DecodeConfig
from specdeck.engine.drafting.drafters import Drafter, PromptLookupDrafter
from specdeck.engine.drafting.proposals import Proposal
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.events import RoundEvent, TokenEvent, TokenState
from specdeck.engine.loading.models import load_tokenizer
from specdeck.engine.loading.registry import DEFAULT_TARGET
from specdeck.engine.loop.decoding import generate
from specdeck.engine.pair import DrafterKind, PairSpec
from specdeck.engine.remote.remote_continuation import PLAIN_CHUNK
from specdeck.engine.remote.remote_http import ServerFault
from specdeck.engine.remote.remote_target import SCORE_BELOW, RemoteSettings, connect
from specdeck.engine.session import load_pair

BLOCK = 16  # tokens per cached block of the fake vLLM
CONTEXT = [300 + (n % 97) * 7 for n in range(1500)]  # a 1,500-token prompt that repeats itself
GREEDY = DecodeConfig(k=4, schedule="constant", max_new_tokens=24)


def best_after(prefix: list[int]) -> int:
    """The served model's greedy next token: the token 97 back, else 100 (so prompt lookup hits)."""
    return prefix[-97] if len(prefix) >= 97 else 100


def row(prefix: list[int], vocab: int) -> dict[int, float]:
    rest = random.Random(len(prefix) * 7919 + prefix[-1]).sample(range(101, vocab), 4)
    best = best_after(prefix)
    return {best: -0.05, **{t: -4.0 - i for i, t in enumerate(rest) if t != best}}


class CachingServer(FakeServer):
    """A fake server of `kind` ("vllm", "sglang") that keeps the token ids it computed and reports,
    per request, the prompt tokens it read from that cache; `extra_rows` rows more than asked make
    its continuation answers faulty."""

    def __init__(self, kind: str, vocab: int, extra_rows: int = 0) -> None:
        self.kind, self.vocab, self.extra_rows = kind, vocab, extra_rows
        self.cached: list[int] = []
        self.requests: list[dict] = []
        fake = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                self.reply({"object": "list", "data": [{"id": "target", "owned_by": fake.kind}]})

            def do_POST(self) -> None:
                body = self.body()
                fake.requests.append(body)
                self.reply(fake.sglang(body) if self.path == "/generate" else fake.vllm(body))

        super().__init__(Handler)

    def _reuse(self, prompt: list[int], usable: bool, block: int) -> int:
        """The prompt tokens read from the cache (whole blocks of `block`), which then holds `prompt`."""
        common = 0
        for a, b in zip(self.cached, prompt[:-1]):  # the last token is always computed: its logits are needed
            if a != b:
                break
            common += 1
        self.cached = list(prompt)
        return (common // block) * block if usable else 0

    def vllm(self, body: dict) -> dict:
        prompt, vocab = body["prompt"], self.vocab
        cached = self._reuse(prompt, body.get("prompt_logprobs") is None, BLOCK)
        usage = {"prompt_tokens": len(prompt), "prompt_tokens_details": {"cached_tokens": cached}}
        if body.get("prompt_logprobs") is not None:
            entries = [None] + [
                {str(t): {"logprob": lp} for t, lp in {prompt[j]: -1.0, **row(prompt[:j], vocab)}.items()}
                for j in range(1, len(prompt))
            ]
            last = {f"token_id:{t}": lp for t, lp in row(prompt, vocab).items()}
            return {"choices": [{"prompt_logprobs": entries, "logprobs": {"top_logprobs": [last]}}], "usage": usage}
        written, rows = list(prompt), []
        for _ in range(body["max_tokens"] + self.extra_rows):
            rows.append({f"token_id:{t}": lp for t, lp in row(written, vocab).items()})
            written.append(best_after(written))
        self.cached = written[:-1]  # the last written token was never fed to the model
        choice = {"logprobs": {"top_logprobs": rows}, "finish_reason": "length"}
        return {"choices": [choice], "usage": usage}

    def sglang(self, body: dict) -> dict:
        full, start = body["input_ids"], body["logprob_start_len"]
        cached = min(self._reuse(full, True, 1), start)  # the positions it must score are computed
        triples = lambda prefix: [[lp, t] for t, lp in row(prefix, self.vocab).items()]  # noqa: E731
        meta = {
            "input_top_logprobs": [triples(full[:j]) for j in range(start, len(full))],
            "output_top_logprobs": [triples(full)],
            "prompt_tokens": len(full),
            "cached_tokens": cached,
            "e2e_latency": 0.001,
        }
        return {"text": "", "meta_info": meta}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(DEFAULT_TARGET)


def greedy_tokens(n: int, context: list[int] = CONTEXT) -> list[int]:
    """The served model's own first `n` greedy tokens after `context`."""
    plain = list(context)
    for _ in range(n):
        plain.append(best_after(plain))
    return plain[len(context) :]


def greedy_text(tokenizer) -> str:
    """The served model's own greedy text after CONTEXT."""
    return tokenizer.decode(greedy_tokens(GREEDY.max_new_tokens))


class FirstRightDrafter(Drafter):
    """Drafts the served model's next token, then a token it never writes: every round's second
    draft is refused."""

    name = "first right"

    def propose(self, ids, shape):
        tokens = [best_after(ids)] + [101] * (shape.k - 1)
        return Proposal(tokens, torch.nn.functional.one_hot(torch.tensor(tokens), self.vocab_width).float())


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_a_round_after_a_long_context_computes_its_new_tokens(tokenizer, kind):
    """After a 1,500-token prompt, each round makes the server compute about its new tokens (as
    the server reports them), not the context again, and the text is the model's greedy text; the
    terminal's summary shows the mean."""
    with CachingServer(kind, len(tokenizer)) as server:
        target = connect(RemoteSettings(server.url, "target", 10.0), tokenizer)
        events = list(generate(target, CONTEXT, GREEDY, PromptLookupDrafter()))
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    assert events[-1].text == greedy_text(tokenizer) and events[-1].accepted > 0
    assert rounds[0].recomputed_tokens >= len(CONTEXT) - BLOCK  # the first round computes the prompt
    assert all(r.recomputed_tokens <= BLOCK + GREEDY.k + 1 for r in rounds[1:])
    assert events[-1].recomputed_tokens == pytest.approx(sum(r.recomputed_tokens for r in rounds) / len(rounds))
    shown = format_summary(events[-1], "a served pair", "a server")  # what the terminal prints
    assert f"recomputed per round  {events[-1].recomputed_tokens:.1f} prompt tokens" in shown and "round trip" in shown


def test_vllm_scoring_drafts_as_prompt_recomputes_the_context_and_is_not_the_default(tokenizer):
    """On vLLM, scoring the drafts as prompt (`prompt_logprobs`) recomputes the whole context every
    round; the default asks for vLLM's own continuation at such a context instead and says so
    before the session."""
    with CachingServer("vllm", len(tokenizer)) as server:
        scored = connect(RemoteSettings(server.url, "target", 10.0, "score"), tokenizer)
        events = list(generate(scored, CONTEXT, GREEDY, PromptLookupDrafter()))
        default = connect(RemoteSettings(server.url, "target", 10.0), tokenizer)
    assert events[-1].text == greedy_text(tokenizer)
    assert all(r.recomputed_tokens >= len(CONTEXT) for r in events if isinstance(r, RoundEvent))
    assert "own greedy continuation" in default.note and "no speed-up" in default.note and not scored.note


def test_the_default_scores_a_short_context_and_continues_a_long_one(tokenizer):
    """`auto` scores drafts as prompt while the context is under `SCORE_BELOW` tokens (a short
    context costs less to recompute than K + 1 decode steps) and asks for the continuation from
    there on: the text is the model's greedy text either way."""
    short = CONTEXT[: SCORE_BELOW // 2]
    with CachingServer("vllm", len(tokenizer)) as server:
        target = connect(RemoteSettings(server.url, "target", 10.0), tokenizer)
        scored = [e for e in generate(target, short, GREEDY, PromptLookupDrafter()) if isinstance(e, RoundEvent)]
    assert all(r.recomputed_tokens >= len(short) for r in scored), [
        r.recomputed_tokens for r in scored
    ]  # every round scored the whole context
    with CachingServer("vllm", len(tokenizer)) as server:
        target = connect(RemoteSettings(server.url, "target", 10.0), tokenizer)
        events = list(generate(target, CONTEXT, GREEDY, PromptLookupDrafter()))
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    assert all(r.recomputed_tokens <= BLOCK + GREEDY.k + 1 for r in rounds[1:])  # after the prompt's
    assert events[-1].text == greedy_text(tokenizer)


def test_a_continued_round_keeps_all_k_plus_1_tokens_whatever_the_drafts(tokenizer):
    """After a 1,500-token prompt on vLLM, each round keeps the server's whole continuation of K + 1
    tokens though its second draft is refused (the acceptance counts the drafts that agreed), the
    last round asks for no more than the budget left, and a round makes the server compute its new
    tokens only: the context stays cached but for the partial block."""
    config = DecodeConfig(k=4, schedule="constant", lookup=0, max_new_tokens=23)
    with CachingServer("vllm", len(tokenizer)) as server:
        target = connect(RemoteSettings(server.url, "target", 10.0), tokenizer)
        events = list(generate(target, CONTEXT, config, FirstRightDrafter()))
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    summary = events[-1]
    assert summary.text == tokenizer.decode(greedy_tokens(23)) and summary.new_tokens == 23
    assert [r.accepted + 1 + r.continued for r in rounds] == [5, 5, 5, 5, 3]
    assert [r.accepted for r in rounds] == [1] * 5 and summary.drafted == 4 * 4 + 2
    assert [q["max_tokens"] for q in server.requests] == [5, 5, 5, 5, 3]
    assert all(r.recomputed_tokens <= BLOCK for r in rounds[1:])  # the partial block and the newest token
    kept = [e.state for e in events if isinstance(e, TokenEvent) and e.state.kept]
    assert kept[:5] == [TokenState.ACCEPTED, TokenState.RESAMPLED] + [TokenState.PLAIN] * 3


@pytest.mark.parametrize("context", [CONTEXT, CONTEXT[: SCORE_BELOW // 2]])
def test_plain_remote_decoding_asks_for_chunks_of_continuation(tokenizer, context):
    """Without a drafter, a session on vLLM asks for chunks of the server's continuation (never one
    scored token a request, which would recompute the context), up to the budget exactly, at a long
    context and a short one; the text is the model's greedy text."""
    config = DecodeConfig(max_new_tokens=2 * PLAIN_CHUNK + 3)
    with CachingServer("vllm", len(tokenizer)) as server:
        target = connect(RemoteSettings(server.url, "target", 10.0), tokenizer)
        events = list(generate(target, context, config))
    assert events[-1].text == tokenizer.decode(greedy_tokens(config.max_new_tokens, context))
    assert [q["max_tokens"] for q in server.requests] == [PLAIN_CHUNK, PLAIN_CHUNK, 3]
    assert not any("prompt_logprobs" in q for q in server.requests)
    assert events[-1].rounds == math.ceil(config.max_new_tokens / PLAIN_CHUNK)


def test_a_stop_string_inside_a_continuation_stops_there(tokenizer):
    """A stop string the server's continuation writes in the middle of a round ends the session at
    the token that completes it, the rest of the continuation not kept."""
    tokens = greedy_tokens(GREEDY.max_new_tokens)
    stop = tokenizer.decode(tokens[6:8])
    assert stop not in tokenizer.decode(tokens[:7])
    config = DecodeConfig(k=4, schedule="constant", lookup=0, max_new_tokens=24, stop_strings=(stop,))
    with CachingServer("vllm", len(tokenizer)) as server:
        target = connect(RemoteSettings(server.url, "target", 10.0), tokenizer)
        summary = list(generate(target, CONTEXT, config, FirstRightDrafter()))[-1]
    assert summary.stop_reason == "stop_string" and summary.new_tokens == 8
    assert summary.text == tokenizer.decode(tokens[:8])


def test_the_continuation_is_said_before_the_session_and_under_the_target(tokenizer):
    """Loading a pair on vLLM says, before any session, that rounds follow vLLM's own continuation
    and promise no speed-up; the pair's note (shown under the target in the window) says it too."""
    said: list[str] = []
    with CachingServer("vllm", len(tokenizer)) as server:
        pair = load_pair(
            PairSpec(server.url, None, DrafterKind.PROMPT_LOOKUP, target_model="target"), progress=said.append
        )
    assert sum("own greedy continuation" in line and "no speed-up" in line for line in said) == 1
    assert "own greedy continuation" in pair.note


def test_a_continuation_with_more_rows_than_asked_is_refused(tokenizer):
    """A vLLM continuation answer with a row more than the tokens asked stops the session, saying so."""
    with CachingServer("vllm", len(tokenizer), extra_rows=1) as server:
        target = connect(RemoteSettings(server.url, "target", 10.0), tokenizer)
        with pytest.raises(ServerFault, match=r"\(vLLM API\) answered /completions .*rows for the \d tokens asked"):
            list(generate(target, CONTEXT, GREEDY, PromptLookupDrafter()))


def test_an_unknown_way_to_verify_is_refused(tokenizer):
    """A verify setting other than auto, score or continue is refused, naming the three."""
    with CachingServer("sglang", len(tokenizer)) as server:
        with pytest.raises(SpecDeckError, match="'auto', 'score' or 'continue'"):
            connect(RemoteSettings(server.url, "target", 10.0, "fast"), tokenizer)


class StreamingServer(FakeServer):
    """A fake llama-cpp-python server: `/extras/tokenize` with the real tokenizer, and a streamed
    continuation that writes `written` (token ids) and then the end-of-text token, which it leaves
    out of the stream as llama-cpp-python does; each chunk names tokens by their text."""

    def __init__(self, tokenizer, written: list[int]) -> None:
        fake = self
        self.requests: list[dict] = []

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                self.reply({"object": "list", "data": [{"id": "target"}]})

            def do_POST(self) -> None:
                body = self.body()
                if self.path == "/extras/tokenize":
                    return self.reply({"tokens": tokenizer.encode(body["input"])})
                fake.requests.append(body)
                chunks = []
                for token in written[: body["max_tokens"]]:
                    text = tokenizer.decode([token])
                    logprobs = {"tokens": [text], "top_logprobs": [{text: -0.1, " dog": -5.0}]}
                    chunks.append({"choices": [{"text": text, "logprobs": logprobs, "finish_reason": None}]})
                finish = "stop" if body["max_tokens"] > len(written) else "length"
                chunks.append({"choices": [{"text": "", "logprobs": None, "finish_reason": finish}]})
                events = "".join(f"data: {json.dumps(c)}\r\n\r\n" for c in chunks) + "data: [DONE]\r\n\r\n"
                return self.reply(events.encode(), "text/event-stream")

        super().__init__(Handler)


def test_a_streamed_continuation_that_ends_the_text_ends_the_session(tokenizer):
    """A llama-cpp-python continuation that stops at the end of text before K + 1 tokens (the
    end-of-text token left out of the stream) ends the session there, its text the server's, the
    drafts it agreed with accepted; the requests send the kept tokens' text only, streamed."""
    prompt = tokenizer.encode("The cat sat on the mat. The cat sat on the mat. The")
    with StreamingServer(tokenizer, tokenizer.encode(" cat sat")) as server:
        target = connect(RemoteSettings(server.url, "target", 10.0, "continue"), tokenizer)
        events = list(generate(target, prompt, GREEDY, PromptLookupDrafter()))
    summary = events[-1]
    assert summary.text == " cat sat" and summary.accepted == 2 and summary.rounds == 1
    assert server.requests[0]["stream"] and server.requests[0]["prompt"] == tokenizer.decode(prompt)
