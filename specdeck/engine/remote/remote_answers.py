"""Every answer SpecDeck reads from a served target, as a schema the answer must meet before any
of it is used (`specdeck.engine.remote.remote_http.Endpoint` validates each one against the schema its caller names).

A served target is trusted for the target's log-probabilities only as far as its answer lines up
with what was sent: one entry per prompt token, each at its position and naming its own token, ids
inside the vocabulary, counts within what was asked, log-probabilities finite and at or below 0.
An answer that is off by one (an extra leading `prompt_logprobs` entry, say) still holds plausible
numbers, and reading it would verify every draft against the wrong position: the text would
differ from the target's own without a word. So a type, count, position, id or missing field that
is not as asked is refused, naming the server and what was wrong.

The schemas are pydantic v2 models (a dependency for this: one declaration per answer kind, with
the location of whatever failed in its error), validated with a context that holds what was sent
(`Expect`). Integers and numbers are strict: "5" or 5.0 is no token id, true is no number.
How each server numbers its positions: `remote_scoring`'s docstring.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
    Strict,
    ValidationError,
    ValidationInfo,
    model_validator,
)

Row = dict[int, float]  # token id -> log-probability


@dataclass(frozen=True)
class Expect:
    """What a request sent, which its answer must match: the prompt's token ids, the top
    log-probabilities asked per position, the vocabulary's width, where SGLang's log-probabilities
    start, and how many entries llama-cpp-python's echo holds (`remote_scoring`)."""

    prompt: list[int] = field(default_factory=list)
    top: int = 0
    vocab: int = 0
    start: int = 0
    entries: int = 0
    lead: bool = False  # the prompt opens with a BOS token (llama-cpp-python leaves its entry out)
    generated: int = 0  # the tokens a continuation asked the server to write (`remote_continuation`)


def expect_of(info: ValidationInfo) -> Expect:
    return info.context["expect"] if info.context else Expect()


def _log_probability(value: float) -> float:
    if not (math.isfinite(value) and value <= 1e-6):
        raise ValueError(
            f"log-probability {value:g} is not a finite number at or below 0: the served model's arithmetic "
            "failed (a float16 overflow, say); serve it in bfloat16 or float32, and check the server's log"
        )
    return value


def _in_vocabulary(token: int, info: ValidationInfo) -> int:
    vocab = expect_of(info).vocab
    if token < 0 or vocab and token >= vocab:
        raise ValueError(
            f"token id {token} is outside SpecDeck's tokenizer (ids 0 to {vocab - 1}): "
            "pass --tokenizer naming the served model"
        )
    return token


LogProbability = Annotated[float, Strict(), AfterValidator(_log_probability)]
TokenId = Annotated[int, Strict(), AfterValidator(_in_vocabulary)]
Count = Annotated[int, Strict(), Field(ge=0)]
Milliseconds = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]


def token_key(key: str, info: ValidationInfo, prefix: str = "") -> int:
    """A token id written as a JSON object's key (`prefix` and digits)."""
    if not re.fullmatch(re.escape(prefix) + r"\d{1,12}", key):
        raise ValueError(f"names a token {key!r}, not {prefix}<id>")
    return _in_vocabulary(int(key.removeprefix(prefix)), info)


def check_listed(row: dict, info: ValidationInfo, what: str) -> None:
    """A position's listed tokens: at least one, at most the top asked and the position's own token."""
    top = expect_of(info).top
    if not row or top and len(row) > top + 1:
        raise ValueError(f"{what} lists {len(row)} tokens where 1 to {top + 1} were asked")


class Answer(BaseModel):
    """An answer of one API; `api` and `advice` complete the message of a refusal."""

    api: ClassVar[str] = "OpenAI-compatible"
    advice: ClassVar[str] = "Check that --target names an OpenAI-compatible API (docs/remote.md)."


class Timings(BaseModel):
    """llama.cpp's own times of a request."""

    prompt_ms: Milliseconds | None = None
    predicted_ms: Milliseconds | None = None
    cache_n: Count | None = None
    prompt_n: Count | None = None  # the prompt tokens it computed, the cached ones left out


class PromptDetails(BaseModel):
    cached_tokens: Count | None = None


class Usage(BaseModel):
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    prompt_tokens_details: PromptDetails | None = None


class MetaInfo(BaseModel):
    """SGLang's account of a request."""

    e2e_latency: Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)] | None = None
    prompt_tokens: Count | None = None
    cached_tokens: Count | None = None


class Timed(Answer):
    """What a completion may report of its own time and its prefix cache (`ServerTime.of`)."""

    timings: Timings | None = None
    usage: Usage | None = None
    meta_info: MetaInfo | None = None


class ModelCard(BaseModel):
    id: str
    owned_by: str | None = None


class ModelList(Answer):
    """`/v1/models`: the models served, and who serves them (`owned_by`: vllm, sglang, ...)."""

    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str


class ErrorBody(Answer):
    """What a server says with an error status: OpenAI's {"error": {"message"}}, FastAPI's {"detail"}."""

    error: ErrorDetail | str | None = None
    detail: Any = None
    message: str | None = None

    def said(self) -> str:
        if isinstance(self.error, ErrorDetail):
            return self.error.message
        return str(next((x for x in (self.error, self.detail, self.message) if x is not None), ""))


class Tokenized(Answer):
    """llama-cpp-python's `/extras/tokenize`: the ids it reads a text as."""

    api: ClassVar[str] = "llama-cpp-python"
    advice: ClassVar[str] = "Check that --target names llama-cpp-python's server (docs/remote.md)."

    tokens: list[TokenId]


class VllmLogprob(BaseModel):
    logprob: LogProbability
    rank: Annotated[int, Strict()] | None = None
    decoded_token: str | None = None


class VllmGenerated(BaseModel):
    top_logprobs: list[dict[str, LogProbability]]


class VllmChoice(BaseModel):
    prompt_logprobs: list[dict[str, VllmLogprob] | None]
    logprobs: VllmGenerated


class VllmCompletion(Timed):
    """vLLM's `/v1/completions` with `prompt_logprobs`: entry j of the prompt's is None for j = 0,
    else the tokens that predicted prompt token j, that token among them (vLLM lists each prompt
    token's own log-probability beside the top ones); the generated token's `top_logprobs` name
    tokens as `token_id:<id>` (`return_tokens_as_token_ids`)."""

    api: ClassVar[str] = "vLLM"
    advice: ClassVar[str] = (
        "vLLM gives one prompt_logprobs entry per prompt token, the first None, each naming its own token: "
        "check that --target is a vLLM server, and what its log says (docs/remote.md)."
    )

    choices: list[VllmChoice] = Field(min_length=1)

    @model_validator(mode="after")
    def _lined_up(self, info: ValidationInfo) -> VllmCompletion:
        prompt, choice = expect_of(info).prompt, self.choices[0]
        given = choice.prompt_logprobs
        if len(given) != len(prompt):
            raise ValueError(f"{len(given)} prompt_logprobs entries for a prompt of {len(prompt)} tokens")
        if given and given[0] is not None:
            raise ValueError("prompt_logprobs[0] holds log-probabilities, where nothing predicts the first token")
        for j in range(1, len(given)):
            entry = given[j]
            if entry is None:
                raise ValueError(f"prompt_logprobs[{j}] is empty")
            if str(prompt[j]) not in entry:
                raise ValueError(
                    f"prompt_logprobs[{j}] does not name prompt token {prompt[j]}: it is not at its position"
                )
            check_listed(entry, info, f"prompt_logprobs[{j}]")
            for key in entry:
                token_key(key, info)
        if len(choice.logprobs.top_logprobs) != 1:
            raise ValueError(f"{len(choice.logprobs.top_logprobs)} top_logprobs for the 1 token asked")
        check_listed(choice.logprobs.top_logprobs[0], info, "top_logprobs[0]")
        for key in choice.logprobs.top_logprobs[0]:
            token_key(key, info, "token_id:")
        return self

    def rows(self, start: int) -> list[Row]:
        """{token: log-probability} after each prompt token from `start` - 1 on, then after the prompt."""
        choice = self.choices[0]
        rows = [{int(t): v.logprob for t, v in (entry or {}).items()} for entry in choice.prompt_logprobs[start:]]
        last = choice.logprobs.top_logprobs[0]
        return [*rows, {int(t.removeprefix("token_id:")): v for t, v in last.items()}]


def _sglang_triple(value: Any) -> Any:
    """SGLang lists [log-probability, token id] with the token's text third where asked for."""
    return [*value, None] if isinstance(value, list) and len(value) == 2 else value


SglangToken = Annotated[tuple[LogProbability, TokenId, str | None], BeforeValidator(_sglang_triple)]


class SglangMeta(MetaInfo):
    input_top_logprobs: list[list[SglangToken] | None]
    output_top_logprobs: list[list[SglangToken]] = Field(min_length=1)
    input_token_logprobs: (
        list[Annotated[tuple[LogProbability | None, TokenId, str | None], BeforeValidator(_sglang_triple)]] | None
    ) = None


class SglangGenerate(Timed):
    """SGLang's `/generate`: `input_top_logprobs[i]` predicted input token `logprob_start_len` + i;
    `input_token_logprobs`, where given, names those input tokens themselves."""

    api: ClassVar[str] = "SGLang"
    advice: ClassVar[str] = (
        "SGLang's /generate gives one input_top_logprobs entry per input token from logprob_start_len: "
        "check that --target is an SGLang server, and what its log says (docs/remote.md)."
    )

    meta_info: SglangMeta

    @model_validator(mode="after")
    def _lined_up(self, info: ValidationInfo) -> SglangGenerate:
        expect, meta = expect_of(info), self.meta_info
        count = len(expect.prompt) - expect.start
        if len(meta.input_top_logprobs) != count:
            raise ValueError(
                f"{len(meta.input_top_logprobs)} input_top_logprobs entries for the {count} input tokens "
                f"from logprob_start_len {expect.start}"
            )
        named = meta.input_token_logprobs
        if named is not None and [token for _, token, _ in named] != expect.prompt[expect.start :]:
            raise ValueError(
                "input_token_logprobs name other tokens than were sent: the entries are not at their positions"
            )
        for i, entry in enumerate([*meta.input_top_logprobs, meta.output_top_logprobs[0]]):
            if entry is None:
                if expect.start + i > 0:  # only the input's first token has nothing that predicted it
                    raise ValueError(f"input_top_logprobs[{i}] is empty")
                continue
            check_listed({token: lp for lp, token, _ in entry}, info, f"input_top_logprobs[{i}]")
        return self

    def rows(self, kept: int, start: int) -> list[Row]:
        """{token: log-probability} after each input token from the `kept`-th on, then after the
        input (`start`: the logprob_start_len asked)."""
        meta = self.meta_info
        entries = [*meta.input_top_logprobs[kept - start :], meta.output_top_logprobs[0]]
        return [{token: lp for lp, token, _ in entry or []} for entry in entries]


class EchoLogprobs(BaseModel):
    top_logprobs: list[dict[str, LogProbability] | None]


class EchoChoice(BaseModel):
    logprobs: EchoLogprobs


class EchoCompletion(Timed):
    """llama-cpp-python's `/v1/completions` with `echo` and `logprobs`: one entry per token of the
    prompt and the generated one, less a leading BOS token's and any later BOS token's; a
    generated end-of-text token goes with its entry (then `usage.completion_tokens` is 0)."""

    api: ClassVar[str] = "llama-cpp-python"
    advice: ClassVar[str] = (
        "llama-cpp-python's server echoes one log-probability entry per token: check that --target is "
        "that server, started with --logits_all true (docs/remote.md)."
    )

    choices: list[EchoChoice] = Field(min_length=1)

    @model_validator(mode="after")
    def _lined_up(self, info: ValidationInfo) -> EchoCompletion:
        expect = expect_of(info)
        given = self.choices[0].logprobs.top_logprobs
        generated = self.usage.completion_tokens if self.usage else None
        ended = expect.lead and not generated and len(given) == expect.entries - 1
        if len(given) != expect.entries and not ended:
            raise ValueError(f"{len(given)} log-probability entries for {expect.entries} tokens")
        for i, entry in enumerate(given):
            if entry is not None:
                check_listed(entry, info, f"entry {i}")
        return self

    def entries(self, count: int) -> list[dict[str, float] | None]:
        """The `count` entries `Expect.entries` asked for: a left-out end-of-text token's as {"": 0}
        (the argmax is that token, printed as nothing; its log-probability not given)."""
        given = self.choices[0].logprobs.top_logprobs
        return [*given, {"": 0.0}] if len(given) == count - 1 else list(given)


def problems(error: ValidationError, limit: int = 3) -> str:
    """What failed in an answer, each at its place in it (`choices[0].prompt_logprobs[3]: ...`)."""
    said = []
    for item in error.errors(include_url=False)[:limit]:
        place = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in item["loc"]).lstrip(".")
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] not in ("missing", "value_error") and not isinstance(item["input"], (dict, list)):
            message += f" (got {item['input']!r:.40})"
        said.append(f"{place}: {message}" if place else message)
    more = error.error_count() - limit
    return "; ".join(said) + (f"; and {more} more" if more > 0 else "")


def context_of(expect: Expect | None) -> dict | None:
    """The validation context that carries what a request sent to its answer's validators."""
    return {"expect": expect} if expect is not None else None
