"""A round verified against the server's own greedy continuation, for servers that can score
drafted tokens only by recomputing the whole context (`remote_target` chooses where).

vLLM computes `prompt_logprobs` outside its prefix cache (vllm-project/vllm 23399), and
llama-cpp-python's `echo` scores every prompt position in Python on every request: on both a
round of drafts scored as prompt costs the whole context, seconds at 1,500 tokens. Both keep the
context cached for generation, so a round asks instead for the server's greedy continuation of
the kept tokens with each written token's top log-probabilities: K + 1 tokens after K drafts, a
chunk of up to `PLAIN_CHUNK` in a round without drafts.

Greedy verification (Leviathan et al. 2023 at temperature 0) reads row r only while drafts
1..r were accepted, that is while they equal the continuation's first r tokens; row r is then the
target's distribution after the kept tokens and those drafts, as a scored prompt's would be. Past
the first draft that parts from it, the continuation is still the target's own greedy text (row
r is the distribution after its first r tokens, its token that row's argmax), so the round keeps
all of it (`specdeck.engine.loop.verification.verify`, `continuation`): a round yields K + 1 tokens
whatever the drafter did. The drafts' acceptance then shows how often they agreed with the
server's text; the speed is the server's own generation, K + 1 decode steps a round, less a
request's overhead and the context the server's prefix cache misses (docs/remote.md). The p shown
for a draft discarded past the first that parted is the continuation's row.

A continuation that ends at the end-of-text token early gets that token's row as probability 1
where the server leaves it out (llama-cpp-python does); the rows after it repeat it.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, Field, ValidationInfo, model_validator

from specdeck.engine.remote.remote_answers import (
    Answer,
    Expect,
    LogProbability,
    Row,
    Timed,
    check_listed,
    expect_of,
    token_key,
)
from specdeck.engine.remote.remote_http import Endpoint
from specdeck.engine.remote.remote_scoring import EchoScoring, ServerTime

CONTINUED_NOTE = (
    "The {server} server scores drafted tokens only by recomputing the whole context each round, so "
    "SpecDeck asks it for its own greedy continuation, K + 1 tokens a round, and keeps all of it: the "
    "text and the speed are the server's own generation, and the acceptance shows how often the drafts "
    "agreed with it, so no speed-up over the server's own generation is promised (docs/remote.md)."
)
# a round without drafts asks a continuing server for up to this many tokens: one request's overhead
# spread over them, while the window still shows text and a cancel still lands every few seconds
PLAIN_CHUNK = 16


class VllmContinuedChoice(BaseModel):
    top_logprobs: list[dict[str, LogProbability]]


class VllmContinuedAnswer(BaseModel):
    logprobs: VllmContinuedChoice
    finish_reason: str | None = None


class VllmContinuation(Timed):
    """vLLM's `/v1/completions` without `prompt_logprobs`: one `top_logprobs` row per written
    token, its tokens written `token_id:<id>`, as many rows as tokens asked unless it stopped."""

    api: ClassVar[str] = "vLLM"
    advice: ClassVar[str] = (
        "vLLM gives one top_logprobs row per token it writes: check that --target is a vLLM server, and "
        "what its log says (docs/remote.md)."
    )

    choices: list[VllmContinuedAnswer] = Field(min_length=1)

    @model_validator(mode="after")
    def _lined_up(self, info: ValidationInfo) -> VllmContinuation:
        _counted(len(self.choices[0].logprobs.top_logprobs), self.choices[0].finish_reason, info)
        for i, row in enumerate(self.choices[0].logprobs.top_logprobs):
            check_listed(row, info, f"top_logprobs[{i}]")
            for key in row:
                token_key(key, info, "token_id:")
        return self

    def rows(self) -> list[Row]:
        return [
            {int(t.removeprefix("token_id:")): v for t, v in row.items()}
            for row in self.choices[0].logprobs.top_logprobs
        ]


class StreamedLogprobs(BaseModel):
    tokens: list[str] = Field(min_length=1, max_length=1)
    top_logprobs: list[dict[str, LogProbability]] = Field(min_length=1, max_length=1)


class StreamedChoice(BaseModel):
    logprobs: StreamedLogprobs | None = None
    finish_reason: str | None = None


class StreamedChunk(BaseModel):
    choices: list[StreamedChoice] = Field(min_length=1)


class StreamedCompletion(Answer):
    """llama-cpp-python's `/v1/completions` streamed with `logprobs`: one chunk per written token
    with its text and top log-probabilities keyed by text, then a closing chunk with the finish
    reason (`Endpoint.post` gathers the server-sent events as `chunks`). A written end-of-text
    token ends it unlisted."""

    api: ClassVar[str] = "llama-cpp-python"
    advice: ClassVar[str] = (
        "llama-cpp-python's server streams one log-probability chunk per written token: check that --target "
        "is that server, started with --logits_all true (docs/remote.md)."
    )

    chunks: list[StreamedChunk] = Field(min_length=1)

    @model_validator(mode="after")
    def _lined_up(self, info: ValidationInfo) -> StreamedCompletion:
        written = self.written()
        _counted(len(written), self.finish_reason(), info)
        for i, (_, row) in enumerate(written):
            check_listed(row, info, f"token {i}")
        return self

    def written(self) -> list[tuple[str, dict[str, float]]]:
        """Each written token's text and its row, in order."""
        logprobs = [c.choices[0].logprobs for c in self.chunks]
        return [(x.tokens[0], x.top_logprobs[0]) for x in logprobs if x is not None]

    def finish_reason(self) -> str | None:
        return next((c.choices[0].finish_reason for c in reversed(self.chunks) if c.choices[0].finish_reason), None)


def _counted(rows: int, finish_reason: str | None, info: ValidationInfo) -> None:
    """As many rows as tokens asked, or fewer where the server stopped at the end of text."""
    asked = expect_of(info).generated
    if rows > asked or rows < asked and finish_reason != "stop":
        raise ValueError(f"{rows} log-probability rows for the {asked} tokens asked (finish reason {finish_reason!r})")


def _filled(rows: list[Row], asked: int, eos: int) -> list[Row]:
    """`rows` to `asked` rows: a continuation that stopped early ended at the end-of-text token,
    whose row the server may leave out (module docstring)."""
    if len(rows) < asked and (not rows or max(rows[-1], key=rows[-1].__getitem__) != eos):
        rows = [*rows, {eos: 0.0}]
    return rows + [rows[-1]] * (asked - len(rows))


class VllmContinuing:
    """vLLM asked for its greedy continuation: token ids in, the prefix cache used."""

    note = CONTINUED_NOTE.format(server="vLLM")

    def __init__(self, top: int, vocab: int, eos: int) -> None:
        self.top = top
        self.vocab = vocab
        self.eos = eos

    def continues(self, ids: list[int], drafts: list[int]) -> bool:
        return True

    def admit(self, endpoint: Endpoint, ids: list[int], drafts: list[int]) -> list[int]:
        return drafts

    def score(
        self, endpoint: Endpoint, model: str, ids: list[int], drafts: list[int], length: int
    ) -> tuple[list[Row], ServerTime]:
        asked = length
        body = {
            "model": model,
            "prompt": ids,
            "max_tokens": asked,
            "temperature": 0.0,
            "logprobs": self.top,
            "return_tokens_as_token_ids": True,
        }
        expect = Expect(prompt=ids, top=self.top, vocab=self.vocab, generated=asked)
        answer, ms = endpoint.post("/completions", body, VllmContinuation, expect)
        return _filled(answer.rows(), asked, self.eos), ServerTime.of(answer, ms)


class EchoContinuing(EchoScoring):
    """llama-cpp-python's server asked for its greedy continuation of the kept tokens' text,
    streamed so that it computes log-probabilities for the written tokens alone (unstreamed, it
    turns the whole context's logits into log-probabilities first)."""

    note = CONTINUED_NOTE.format(server="llama-cpp-python")

    def continues(self, ids: list[int], drafts: list[int]) -> bool:
        return True

    def admit(self, endpoint: Endpoint, ids: list[int], drafts: list[int]) -> list[int]:
        """The drafts, all of them (none is sent), once the kept tokens' text reads back as them."""
        super().admit(endpoint, ids, [])
        return drafts

    def score(
        self, endpoint: Endpoint, model: str, ids: list[int], drafts: list[int], length: int
    ) -> tuple[list[Row], ServerTime]:
        asked = length
        body = {
            "model": model,
            "prompt": self.text(ids),
            "max_tokens": asked,
            "temperature": 0.0,
            "logprobs": self.top,
            "repeat_penalty": 1.0,  # its default (1.1) would move the argmax
            "stream": True,
        }
        expect = Expect(prompt=ids, top=self.top, vocab=len(self.tokenizer), generated=asked)
        answer, ms = endpoint.post("/completions", body, StreamedCompletion, expect, events=True)
        rows = []
        for r, (_, row) in enumerate(answer.written()):
            draft = drafts[r] if r < len(drafts) else None
            rows.append({self._token(text, draft): lp for text, lp in row.items()})
        return _filled(rows, asked, self.eos), ServerTime.of(Timed(), ms)
