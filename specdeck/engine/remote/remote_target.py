"""A target served over an OpenAI-compatible HTTP API (vLLM, SGLang, llama-cpp-python's server): the
local drafter proposes, and one request per round asks the server for the target's
log-probabilities at every drafted position and after the last, which is all that greedy
verification needs (`specdeck.engine.loop.verification.verify`; Leviathan et al. 2023 with temperature 0).

Round i of a session sends the kept tokens x_1..x_t and the drafts d_1..d_K; the answer gives, for
rows r = 0..K, the server's top log-probabilities after x_1..x_t, d_1..d_r. Each row becomes a logit
row: the listed tokens at their log-probabilities, every other token at an equal share of the
probability the server did not list, so that p is exact for the listed tokens and the argmax is the
server's. Sampling would need the whole distribution, which these servers return only as top-k:
a remote target decodes greedily, and refuses sampling saying so.

How each server is asked (`owned_by` in its `/v1/models` answer says which one it is), with
`RemoteSettings.verify` "score" (the drafts scored as prompt) or "continue" (the server's own
greedy continuation, the drafts compared with it and all of it kept, `remote_continuation`); "auto"
takes the way whose round does not recompute the whole context on that server, and on vLLM scores
drafts while the context is short (`SCORE_BELOW` tokens: one batched forward beats K + 1 decode
steps there), and continues in a round without drafts at any length:
- SGLang (auto: score): `/generate` with `input_ids`, `return_logprob`, `logprob_start_len`,
  `top_logprobs_num`, which scores the new positions after its radix cache's prefix.
- vLLM (auto: score, then continue): `/v1/completions` with the prompt as token ids, and `prompt_logprobs`
  (its extension) to score, which skips its prefix cache.
- otherwise, llama-cpp-python's server (auto: continue): `/v1/completions`, with `echo` and
  `logprobs` to score, which turns every prompt position into log-probabilities in Python. It
  takes text only, so the text is first sent to its `/extras/tokenize` to check that the server
  reads back the very ids SpecDeck holds; drafts it would read otherwise are cut off before the
  round. Its answer names tokens by their text; a text several tokens share is resolved to the
  draft at that position where it is one of them, else to the end-of-text token for the empty
  text, else to the token SpecDeck's tokenizer writes for that text.
llama-cpp-python's server and vLLM are tested against real servers here
(tests/engine/remote/test_remote_target.py, tests/engine/remote/test_remote_target_vllm.py); SGLang
against a fake server that answers as its documented API does (docs/remote.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdeck.engine.config import DecodeConfig
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.remote.remote_answers import ModelList, Row
from specdeck.engine.remote.remote_continuation import EchoContinuing, VllmContinuing
from specdeck.engine.remote.remote_http import Endpoint, ServerFault, redact
from specdeck.engine.remote.remote_scoring import EchoScoring, Scoring, ServerTime, SglangScoring, VllmScoring

TOP_LOGPROBS = 5  # log-probabilities asked per position: the argmax and a few to show p by
# "auto" scores drafts as prompt below this many tokens of context: recomputing a short context
# costs less than the K + 1 decode steps of a continuation
SCORE_BELOW = 256


@dataclass(frozen=True)
class RemoteSettings:
    """Where the target is served: the API's base address, the model's name there, and how long a
    request may take before the session stops (the key comes from the environment, `remote_http`)."""

    url: str
    model: str
    timeout_s: float
    verify: str = "auto"  # "score", "continue" or "auto" (module docstring)


class RemoteTarget:
    """A served target with what the decoding loop reads of a loaded one (`LoadedModel`): its name,
    tokenizer (SpecDeck's own, which must be the served model's), vocabulary width and end-of-text
    ids; no local model (`model` is None)."""

    model = None
    output_ids = None
    device = torch.device("cpu")
    dtype = torch.float32
    backend = "a server"  # what runs the target (a local one's `LoadedModel.backend`)
    runs = "a server"  # what runs the target, in words (a local one's `LoadedModel.runs`)

    def __init__(self, settings: RemoteSettings, tokenizer, endpoint: Endpoint, scoring: Scoring, server: str) -> None:
        self.settings = settings
        self.name = f"{settings.model} at {settings.url}"
        self.tokenizer = tokenizer
        self.endpoint = endpoint
        self.scoring = scoring
        self.server = server  # which API the requests follow: "vllm", "sglang" or "llama-cpp-python"
        self.vocab_width = len(tokenizer)
        self.note = getattr(scoring, "note", "")  # what to say before a session: how a round is verified

    @property
    def eos_ids(self) -> frozenset[int]:
        eos = self.tokenizer.eos_token_id
        return frozenset([eos] if isinstance(eos, int) else eos or [])

    def admit(self, ids: list[int], drafts: list[int]) -> list[int]:
        """The drafts this round can send after the kept tokens `ids`: all of them where the server
        takes token ids; where it takes text, those whose text it reads back as the same ids."""
        return self.scoring.admit(self.endpoint, ids, drafts)

    def continues(self, ids: list[int], drafts: list[int]) -> bool:
        """Whether the round after `ids` with `drafts` is answered by the server's own greedy
        continuation (`remote_continuation`), which the round keeps whole."""
        return self.scoring.continues(ids, drafts)

    def score(self, ids: list[int], drafts: list[int], length: int) -> tuple[torch.Tensor, ServerTime]:
        """Logit rows (length, vocab) from one request, and where the request's time went: after
        `ids` and after each draft where the drafts are scored (`length` is then len(drafts) + 1),
        along the server's continuation of `ids` where it `continues`."""
        rows, time = self.scoring.score(self.endpoint, self.settings.model, ids, drafts, length)
        if len(rows) != length:
            raise ServerFault(
                f"The server at {self.settings.url} gave {len(rows)} rows of log-probabilities for "
                f"{length} positions: it does not answer as the {self.server} API does."
            )
        for row in rows:
            self._check_sense(row)
        return torch.stack([self._logit_row(row) for row in rows]), time

    def _check_sense(self, row: dict[int, float]) -> None:
        """Stop at a distribution no working model gives: values that are not finite log-probabilities,
        or every listed token at 1/vocabulary (a model whose weights the server did not load: its
        answers would all agree with any draft, and the text would be nonsense without a word)."""
        values = list(row.values())
        if not all(math.isfinite(v) and v <= 1e-6 for v in values):
            raise ServerFault(
                f"The server at {self.settings.url} answered log-probabilities that are not finite numbers at or "
                f"below 0 ({', '.join(f'{v:g}' for v in values[:3])}): its model's arithmetic failed (a float16 "
                "overflow, say). Serve the model in bfloat16 or float32, and check the server's log."
            )
        uniform = -math.log(self.vocab_width)
        if len(values) > 1 and max(values) - min(values) < 1e-3 and abs(max(values) - uniform) < 0.05:
            raise ServerFault(
                f"The server at {self.settings.url} answered the same log-probability for every token "
                f"({max(values):.2f}, log 1/{self.vocab_width}): its model computes nothing, as when its weights "
                "did not load (a tied embedding saved under another name than the server reads, say). Check the "
                "server's log, and serve a folder whose weights it loads."
            )

    def _logit_row(self, row: dict[int, float]) -> torch.Tensor:
        """Listed tokens at their log-probabilities; the rest share what the server left unlisted."""
        if not row:
            raise ServerFault(f"The server at {self.settings.url} gave no log-probabilities for a position.")
        listed = sum(math.exp(lp) for lp in row.values())
        unlisted = self.vocab_width - len(row)
        rest = math.log(max(1.0 - listed, 1e-30) / unlisted) if unlisted else -math.inf
        logits = torch.full((self.vocab_width,), min(rest, min(row.values())))
        for token, lp in row.items():
            if not 0 <= token < self.vocab_width:
                raise SpecDeckError(
                    f"The server at {self.settings.url} names token {token}, beyond SpecDeck's "
                    f"tokenizer ({self.vocab_width} tokens): pass --tokenizer naming the served model."
                )
            logits[token] = lp
        return logits

    def describe(self) -> str:
        return f"{self.settings.model} served at {self.settings.url} ({self.server} API)"


def require_greedy(config: DecodeConfig) -> None:
    """Refuse sampling for a remote target, and say why."""
    if not config.greedy:
        raise SpecDeckError(
            "A remote target decodes greedily only (temperature 0): sampling speculatively needs the target's "
            "whole distribution at each draft, and servers return only its top few log-probabilities, so the "
            "text would no longer follow the target's distribution. Set the temperature to 0."
        )


def connect(settings: RemoteSettings, tokenizer) -> RemoteTarget:
    """The served target, after one request that checks the server answers and serves the model."""
    if not settings.model.strip():
        raise SpecDeckError(
            "A remote target needs the model's name on the server: pass --target-model "
            "(the server lists its models at /v1/models)."
        )
    endpoint = Endpoint(settings.url, settings.timeout_s)
    models = endpoint.get("/models", ModelList).data
    names = [m.id for m in models]
    if settings.model not in names:
        served = ", ".join(names) or "no model"  # the server's own words: they may echo the key
        raise SpecDeckError(
            redact(f"The server at {settings.url} serves {served}, not {settings.model!r}: ")
            + "pass one of those as --target-model."
        )
    owner = (models[names.index(settings.model)].owned_by or "").lower()
    server = owner if owner in ("vllm", "sglang") else "llama-cpp-python"
    return RemoteTarget(settings, tokenizer, endpoint, _scoring(server, settings.verify, tokenizer), server)


def _scoring(server: str, verify: str, tokenizer) -> Scoring:
    """How a round is verified on `server` (module docstring)."""
    if verify not in ("auto", "score", "continue"):
        raise SpecDeckError(f"A remote round verifies by 'auto', 'score' or 'continue', not {verify!r}.")
    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    if server == "sglang":
        if verify == "continue":
            raise SpecDeckError("SGLang scores drafts after its cached prefix: verify by 'score' or 'auto' there.")
        return SglangScoring(TOP_LOGPROBS, vocab)
    if server == "vllm":
        scoring: Scoring = VllmScoring(TOP_LOGPROBS, vocab)
        continuing: Scoring = VllmContinuing(TOP_LOGPROBS, vocab, eos)
        if verify == "auto":
            return ByContext(scoring, continuing, SCORE_BELOW)
    else:  # llama-cpp-python's echo is slow at any context: auto continues there
        scoring, continuing = EchoScoring(tokenizer, TOP_LOGPROBS), EchoContinuing(tokenizer, TOP_LOGPROBS)
    return scoring if verify == "score" else continuing


class ByContext:
    """`short` for a round with drafts whose context is under `below` tokens, `long` from there on
    and for a round without drafts (`long` continues: one scored token a request would recompute
    the context for each token): both ways give the server's own greedy text, so a session may
    change ways between rounds."""

    def __init__(self, short: Scoring, long: Scoring, below: int) -> None:
        self.short, self.long, self.below = short, long, below
        said = getattr(long, "note", "")
        self.note = said and f"From {below} tokens of context on: {said[0].lower()}{said[1:]}"

    def _way(self, ids: list[int], drafts: list[int]) -> Scoring:
        return self.short if drafts and len(ids) < self.below else self.long

    def continues(self, ids: list[int], drafts: list[int]) -> bool:
        return self._way(ids, drafts).continues(ids, drafts)

    def admit(self, endpoint: Endpoint, ids: list[int], drafts: list[int]) -> list[int]:
        return self._way(ids, drafts).admit(endpoint, ids, drafts)

    def score(
        self, endpoint: Endpoint, model: str, ids: list[int], drafts: list[int], length: int
    ) -> tuple[list[Row], ServerTime]:
        return self._way(ids, drafts).score(endpoint, model, ids, drafts, length)
