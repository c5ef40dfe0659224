"""Typed, immutable events that a decoding session streams out.

This is the seam between the engine and every front end (terminal, window, benchmark): a session
is a generator of these events, in order. Per round: the round's token events (drafted tokens that
were accepted, the first one rejected and those after it, which were discarded unjudged, then the
target's own token: resampled after a rejection, bonus after a fully accepted draft, or plain
when there is no drafter), then one `RoundEvent`. The last event is a
`SummaryEvent`.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass


class TokenState(str, enum.Enum):
    """What happened to one token."""

    ACCEPTED = "accepted"  # drafted, and the target agreed: kept
    REJECTED = "rejected"  # drafted, and the target refused it: not kept
    DISCARDED = "discarded"  # drafted but never judged (after a rejected draft of its round; a sampled
    # tree's alternative left untried when the first draft or an earlier alternative passed): not kept
    RESAMPLED = "resampled"  # the target's replacement for the first rejected draft token: kept
    BONUS = "bonus"  # every draft token passed; the target's next token comes free: kept
    PLAIN = "plain"  # the target's own token, no draft judged (plain decoding; a served target's
    # continuation after the round's own token): kept

    @property
    def kept(self) -> bool:
        return self not in (TokenState.REJECTED, TokenState.DISCARDED)

    @property
    def judged(self) -> bool:
        """Whether the rejection rule decided this draft's fate (min(1, p/q) means something)."""
        return self in (TokenState.ACCEPTED, TokenState.REJECTED)


@dataclass(frozen=True, slots=True)
class SessionStarted:
    """The prompt is tokenized and both models are prefilled."""

    mode: str  # "plain" or "speculative"
    drafter: str  # drafter name, "" for plain decoding
    prompt_tokens: int
    prefill_ms: float
    type: str = "start"
    prompt_tokens_dropped: int = 0  # cut from the prompt's start to fit the context (`DecodeConfig.truncate_prompt`)
    # the auto schedule's measured costs on this machine (empty under other schedules): the target's
    # forward over n new tokens at each n of `curve_tokens`, in ms, and a draft token's ms
    curve_tokens: tuple[int, ...] = ()
    curve_ms: tuple[float, ...] = ()
    draft_ms: float = 0.0
    runs: str = ""  # what runs the target, in words (`LoadedModel.runs`)


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One token's fate.

    `pos` is the index among generated tokens where the token stands (kept) or was proposed
    (rejected or discarded: a draft at depth d of a round that starts at position s was proposed
    for s + d - 1, so the first rejected one shares its `pos` with the token that replaces it). `p` is the target's
    probability of the token and `q` the drafter's (None when nothing drafted it), both under the
    session's sampling settings (temperature 1 for greedy sessions). `copied`: a draft that prompt
    lookup copied from earlier text (`DecodeConfig.lookup`) rather than one the drafter proposed.
    `depth`: a draft's place in its round's chain, 1 for the first (and for a tree's alternatives
    to it); 0 for the target's own tokens. `source`: for a draft copied from text (by prompt
    lookup, a suffix drafter or a hybrid's copier), where that text was: "prompt" (this request's
    prompt and answer so far), "session" (an earlier answer since SpecDeck started), "texts" (the
    target's own texts, `specdeck.train.target_texts`), "past" (a past session's,
    `DecodeConfig.suffix_scope`); "" for model drafts and the target's own tokens. `token_id`, `p` and `q` are in the target's
    tokenizer; a draft with a tokenizer of its own (`specdeck.engine.drafting.cross_vocab`) also gives, for each of its
    drafts, the tokens it wrote for it in its own tokenizer (`draft_tokens`, as text) and its q for
    each (`draft_q`). `chance`: for a sampled tree's alternative that was judged, the chance the rule
    gave it against the residual (`specdeck.engine.loop.verification.verify`), which `acceptance_probability`
    reports.
    """

    state: TokenState
    token_id: int
    text: str
    pos: int
    round: int
    p: float
    q: float | None
    type: str = "token"
    copied: bool = False
    depth: int = 0
    source: str = ""
    draft_tokens: tuple[str, ...] = ()
    draft_q: tuple[float, ...] = ()
    chance: float | None = None  # a sampled tree's alternative: the chance it had against the residual

    @property
    def acceptance_probability(self) -> float | None:
        """The chance the rejection rule keeps a drafted token: min(1, p/q), or `chance` for a sampled
        tree's alternative; None for tokens it did not judge (the target's own, and drafts discarded
        unjudged)."""
        if self.q is None or not self.state.judged:
            return None
        if self.chance is not None:
            return self.chance
        return 1.0 if self.q <= 0 else min(1.0, self.p / self.q)


@dataclass(frozen=True, slots=True)
class RoundEvent:
    """One verify round: `drafted` tokens proposed (copied by prompt lookup if `copied`), the first
    `accepted` of them kept; `discarded` of them came after the rejected one and were never judged.
    `shape` names what the round drafted: "K=2", "copy 3", or "none" (a plain step, which the auto
    schedule chooses where drafting would not pay). `match_length`: for drafts copied from text, how
    many of the last kept tokens matched where they were copied from; `source`, where they were
    copied from (as `TokenEvent.source` names it; "" for a model's drafts). `drafted`, `accepted` and
    `discarded` count the target's tokens; `draft_tokens`, the tokens a draft with a tokenizer of its
    own wrote in the round (None when the drafter speaks the target's vocabulary).

    A remote target's round (`specdeck.engine.remote.remote_target`) also splits `verify_ms`: `network_ms`, the
    request's round trip less `server_ms`, the server's own time where it reports it (None where
    not); `server_cache_hit`, whether the server reported reusing a cached prefix (None: not
    reported); `recomputed_tokens`, the prompt tokens the server reported computing for the round
    (about K + 1 where its prefix cache held the context, the whole context where it recomputed
    it; None: not reported). All four are None for a local target. `continued`: the tokens kept
    after the target's own token, where a served target answered with its continuation and the round
    kept all of it (`specdeck.engine.remote.remote_continuation`); 0 otherwise."""

    round: int
    drafted: int
    accepted: int
    draft_ms: float
    verify_ms: float
    new_tokens: int  # kept tokens generated so far, this round's included
    elapsed_s: float  # decoding time so far, prefill excluded
    type: str = "round"
    copied: bool = False
    shape: str = ""
    match_length: int = 0
    source: str = ""
    discarded: int = 0
    draft_tokens: int | None = None
    network_ms: float | None = None
    server_ms: float | None = None
    server_cache_hit: bool | None = None
    recomputed_tokens: int | None = None
    continued: int = 0


@dataclass(frozen=True, slots=True)
class SummaryEvent:
    """The session's end: its text and figures (see `specdeck.engine.stats`)."""

    text: str
    new_tokens: int
    rounds: int
    drafted: int
    accepted: int
    acceptance_rate: float
    mean_accepted_length: float
    tokens_per_s: float
    decode_s: float
    prefill_ms: float
    target_forwards_per_token: float
    accepted_by_position: tuple[float, ...]
    predicted_speedup: float | None
    # "max_new_tokens", "eos", "stop_string", "cancelled", "context" (`specdeck.engine.context`), "server_error"
    stop_reason: str
    type: str = "summary"
    copied_drafted: int = 0  # of `drafted`, those prompt lookup copied (`DecodeConfig.lookup`)
    copied_accepted: int = 0  # of `accepted`, those copied
    plan: str = ""  # the auto schedule: what it chose and why (measured costs, acceptance by depth)
    discarded: int = 0  # of `drafted`, those never judged: proposed after a rejected draft of their round
    # a remote target's rounds (`RoundEvent`): mean network and server ms per round (server: where
    # reported), and the rounds whose server reported no prefix-cache hit (None: never reported)
    network_ms: float | None = None
    server_ms: float | None = None
    cache_misses: int | None = None
    recomputed_tokens: float | None = None  # a remote target's mean per reported round (`RoundEvent`)


Event = SessionStarted | TokenEvent | RoundEvent | SummaryEvent


def event_to_dict(event: Event) -> dict:
    """A JSON-ready dict of an event (used by `--jsonl` and the CSV export)."""
    row = asdict(event)
    if isinstance(event, TokenEvent):
        row["state"] = event.state.value
    if isinstance(event, SummaryEvent):
        row["accepted_by_position"] = list(event.accepted_by_position)
    return row
