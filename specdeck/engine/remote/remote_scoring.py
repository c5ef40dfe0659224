"""How each kind of server is asked for a round's log-probabilities (`specdeck.engine.remote.remote_target`), and
where the round's request time went (`ServerTime`).

Each `Scoring.score` sends the kept tokens `ids` and the drafts in one request and returns one
row per position r = 0..len(drafts): {token id: log-probability} of the server's top tokens after
ids + drafts[:r]. The positions line up as each server numbers them:
- vLLM, `prompt_logprobs[j]`: the distribution that predicted prompt token j (None for j = 0); the
  row after the whole prompt is the generated token's `top_logprobs`.
- SGLang, `meta_info.input_top_logprobs[i]`: the distribution that predicted input token
  `logprob_start_len + i`; after the whole input, `output_top_logprobs[0]`.
- llama-cpp-python, `echo` + `logprobs`: one entry per token of the prompt and the generated token,
  a leading BOS token dropped and every later one skipped; entry i holds the model's output after
  token i of the full prompt (measured, docs/remote.md), so that with a leading BOS each
  entry is the distribution that predicted its own token, and without one it is shifted by one
  (and the generated token has no entry: the server holds one output per prompt token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from specdeck.engine.errors import SpecDeckError
from specdeck.engine.remote.remote_answers import (
    EchoCompletion,
    Expect,
    Row,
    SglangGenerate,
    Timed,
    Tokenized,
    VllmCompletion,
)
from specdeck.engine.remote.remote_http import Endpoint


@dataclass(frozen=True)
class ServerTime:
    """Where a round's request went: the whole round trip, of it the server's own time where the
    server reports it, the prompt tokens it reports reusing from its prefix cache, and the prompt
    tokens it reports computing (None: not reported). The network's share is the round trip less
    the server's time. `recomputed_tokens` is what tells a round that costs its new tokens (about
    K + 1) from one that recomputes the whole context's prefill."""

    round_trip_ms: float
    server_ms: float | None = None
    cached_tokens: int | None = None
    recomputed_tokens: int | None = None

    @property
    def network_ms(self) -> float:
        return self.round_trip_ms - self.server_ms if self.server_ms is not None else self.round_trip_ms

    @property
    def cache_hit(self) -> bool | None:
        """Whether the server reused a cached prefix (None where it does not say)."""
        return None if self.cached_tokens is None else self.cached_tokens > 0

    @classmethod
    def of(cls, answer: Timed, round_trip_ms: float) -> ServerTime:
        """The times an answer reports: llama.cpp's `timings`, OpenAI's `usage.prompt_tokens_details`,
        SGLang's `meta_info`."""
        timings, usage, meta = answer.timings, answer.usage, answer.meta_info
        details = usage.prompt_tokens_details if usage else None
        server_ms = None
        if timings and timings.prompt_ms is not None:
            server_ms = timings.prompt_ms + (timings.predicted_ms or 0.0)
        elif meta and meta.e2e_latency is not None:
            server_ms = meta.e2e_latency * 1e3
        counts = (
            timings.cache_n if timings else None,
            details.cached_tokens if details else None,
            meta.cached_tokens if meta else None,
        )
        cached = next((n for n in counts if n is not None), None)
        return cls(round_trip_ms, server_ms, cached, _recomputed(answer, cached))


def _recomputed(answer: Timed, cached: int | None) -> int | None:
    """The prompt tokens the server reports computing for a request: llama.cpp's `prompt_n`, else
    the prompt's tokens less the cached ones (OpenAI's `usage`, SGLang's `meta_info`)."""
    if answer.timings and answer.timings.prompt_n is not None:
        return answer.timings.prompt_n
    prompt = next(
        (x.prompt_tokens for x in (answer.usage, answer.meta_info) if x and x.prompt_tokens is not None), None
    )
    if prompt is None or cached is None:
        return None
    return max(prompt - cached, 0)


class Scoring(Protocol):
    """One way to ask a server for a round's rows: `continues` says whether the round after `ids`
    with `drafts` gets the server's own greedy continuation (`remote_continuation`), whose `length`
    rows the round keeps whole, rather than the drafts scored (len(drafts) + 1 rows, `length` then)."""

    def continues(self, ids: list[int], drafts: list[int]) -> bool: ...

    def admit(self, endpoint: Endpoint, ids: list[int], drafts: list[int]) -> list[int]: ...

    def score(
        self, endpoint: Endpoint, model: str, ids: list[int], drafts: list[int], length: int
    ) -> tuple[list[Row], ServerTime]: ...


class VllmScoring:
    """vLLM's `/v1/completions`: token ids in, `prompt_logprobs` out."""

    def __init__(self, top: int, vocab: int) -> None:
        self.top = top
        self.vocab = vocab

    def continues(self, ids: list[int], drafts: list[int]) -> bool:
        return False

    def admit(self, endpoint: Endpoint, ids: list[int], drafts: list[int]) -> list[int]:
        return drafts

    def score(
        self, endpoint: Endpoint, model: str, ids: list[int], drafts: list[int], length: int
    ) -> tuple[list[Row], ServerTime]:
        body = {
            "model": model,
            "prompt": ids + drafts,
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": self.top,
            "prompt_logprobs": self.top,
            "return_tokens_as_token_ids": True,
        }
        expect = Expect(prompt=ids + drafts, top=self.top, vocab=self.vocab)
        answer, ms = endpoint.post("/completions", body, VllmCompletion, expect)
        return answer.rows(len(ids)), ServerTime.of(answer, ms)


class SglangScoring:
    """SGLang's native `/generate`: `input_ids` in, top log-probabilities from the first draft on out."""

    def __init__(self, top: int, vocab: int) -> None:
        self.top = top
        self.vocab = vocab

    def continues(self, ids: list[int], drafts: list[int]) -> bool:
        return False

    def admit(self, endpoint: Endpoint, ids: list[int], drafts: list[int]) -> list[int]:
        return drafts

    def score(
        self, endpoint: Endpoint, model: str, ids: list[int], drafts: list[int], length: int
    ) -> tuple[list[Row], ServerTime]:
        full = ids + drafts
        start = min(len(ids), len(full) - 1)  # the first draft's position (a start past the input is refused)
        body = {
            "input_ids": full,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True,
            "logprob_start_len": start,
            "top_logprobs_num": self.top,
        }
        expect = Expect(prompt=full, top=self.top, vocab=self.vocab, start=start)
        answer, ms = endpoint.post("/generate", body, SglangGenerate, expect, root=True)
        return answer.rows(len(ids), start), ServerTime.of(answer, ms)


class EchoScoring:
    """llama-cpp-python's `/v1/completions` with `echo` and `logprobs`, which takes text: the text of
    the ids is checked against the server's `/extras/tokenize` first."""

    def __init__(self, tokenizer, top: int) -> None:
        self.tokenizer = tokenizer
        self.top = top
        self.bos = tokenizer.bos_token_id
        self.eos = tokenizer.eos_token_id
        self._pieces: dict[str, list[int]] | None = None

    def continues(self, ids: list[int], drafts: list[int]) -> bool:
        return False

    def text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def admit(self, endpoint: Endpoint, ids: list[int], drafts: list[int]) -> list[int]:
        """The longest run of `drafts` whose text, after the kept tokens', the server tokenizes back
        to the same ids; the kept tokens themselves must read back, else a `SpecDeckError`. At most
        three tokenize requests: the drafts, the drafts up to where the server first read otherwise,
        then none."""
        if self.bos in drafts:  # the server's answer leaves out BOS tokens, and with them their rows
            drafts = drafts[: drafts.index(self.bos)]
        for attempt in range(3):
            full = ids + drafts
            vocab = Expect(vocab=len(self.tokenizer))
            read, _ = endpoint.post("/extras/tokenize", {"input": self.text(full)}, Tokenized, vocab, root=True)
            tokens = read.tokens
            if tokens == full:
                return drafts
            differ = next((i for i, (a, b) in enumerate(zip(tokens, full)) if a != b), min(len(tokens), len(full)))
            if differ < len(ids) or not drafts:
                raise SpecDeckError(
                    f"The server at {endpoint.base} takes text, and reads the text so far as other tokens than "
                    f"SpecDeck holds (from token {differ}: the server reads {self._shown(tokens[differ : differ + 3])}, "
                    f"SpecDeck holds {self._shown(full[differ : differ + 3])}). Either SpecDeck's tokenizer is not the "
                    "served model's (pass --tokenizer naming it), or the target wrote tokens that its tokenizer "
                    "joins or splits otherwise when it reads their text, which a server that takes text cannot be "
                    "given back: serve the model with vLLM or SGLang, which take token ids."
                )
            drafts = drafts[: differ - len(ids)] if attempt == 0 else []
        return drafts

    def score(
        self, endpoint: Endpoint, model: str, ids: list[int], drafts: list[int], length: int
    ) -> tuple[list[Row], ServerTime]:
        full = ids + drafts
        body = {
            "model": model,
            "prompt": self.text(full),
            "max_tokens": 1,
            "temperature": 0.0,
            "echo": True,
            "logprobs": self.top,
            "repeat_penalty": 1.0,
        }  # its default penalty (1.1) would move the argmax
        lead = 1 if full[0] == self.bos else 0
        # the entries' tokens: what is left of the prompt, then the generated one, as far as the server
        # has outputs for (one per prompt token: without a leading BOS, the generated one goes unlisted)
        labels = (full[lead:] + [-1])[: len(full)]
        entry = [i for i, token in enumerate(labels) if token != self.bos]  # the entries the answer holds
        expect = Expect(prompt=full, top=self.top, vocab=len(self.tokenizer), entries=len(entry), lead=bool(lead))
        answer, ms = endpoint.post("/completions", body, EchoCompletion, expect)
        given = answer.entries(len(entry))
        rows = []
        for r in range(len(ids) - 1, len(full)):  # entry r holds the output after token r of the full prompt
            if labels[r] == self.bos or given[entry.index(r)] is None:
                raise SpecDeckError(
                    "A remote target on this server needs a prompt of two tokens or more, and "
                    "cannot verify a BOS token: use a longer prompt."
                )
            draft = full[r + 1] if r + 1 < len(full) else None
            rows.append({self._token(text, draft): lp for text, lp in (given[entry.index(r)] or {}).items()})
        return rows, ServerTime.of(answer, ms)

    def _shown(self, tokens: list[int]) -> str:
        return "[" + ", ".join(f"{t} {self.text([t])!r}" for t in tokens) + "]"

    def _token(self, text: str, draft: int | None) -> int:
        """The token the server named by `text` (module docstring: how a shared text is resolved)."""
        candidates = self.pieces().get(text)
        if not candidates:
            raise SpecDeckError(
                f"The server names a token {text!r} that SpecDeck's tokenizer has no token for: "
                "pass --tokenizer naming the served model."
            )
        if draft in candidates or len(candidates) == 1:
            return draft if draft in candidates else candidates[0]
        if text == "" and self.eos in candidates:
            return self.eos
        written = self.tokenizer.encode(text, add_special_tokens=False)
        return written[0] if len(written) == 1 and written[0] in candidates else candidates[0]

    def pieces(self) -> dict[str, list[int]]:
        """Each token's text as this server prints it (special tokens as nothing, a byte that is part
        of a character as nothing), and the tokens printed so."""
        if self._pieces is None:
            self._pieces = {}
            for token in range(len(self.tokenizer)):
                text = self.tokenizer.decode(
                    [token], skip_special_tokens=True, clean_up_tokenization_spaces=False
                ).replace("\ufffd", "")
                self._pieces.setdefault(text, []).append(token)
        return self._pieces
