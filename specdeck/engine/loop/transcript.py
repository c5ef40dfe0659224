"""A session told as events (`specdeck.engine.events`): each round's token events in the order a reader
meets them, its `RoundEvent`, and the summary, with the kept text and the counts (`specdeck.engine.stats`).

Per round: the kept tokens in order (the accepted drafts, then the target's own token: resampled
after a refusal, a bonus after a round whose drafts all passed, plain without drafts); the refused
drafts come just before the token kept in place of the first of them, each at the position it was
proposed for: the first refused one rejected, the chain's drafts after it discarded, never judged.
A tree's alternatives to the first draft are shown before the round's first kept token: greedy,
where the first draft was refused, all rejected but the one the target took; sampled, tried in turn
after the first draft's refusal, those tried and refused rejected, the rest (after the one
accepted, or all, where the first draft passed) discarded. A stop (an end-of-text token, a stop
string) cuts a round short, and its counts hold the shown drafts only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch

from specdeck.engine.config import DecodeConfig
from specdeck.engine.drafting.proposals import DraftPiece
from specdeck.engine.events import Event, RoundEvent, SessionStarted, SummaryEvent, TokenEvent, TokenState
from specdeck.engine.loading.models import LoadedModel
from specdeck.engine.loop.detok import Detokenizer
from specdeck.engine.loop.rounds import Clock, Draft
from specdeck.engine.remote.remote_scoring import ServerTime
from specdeck.engine.remote.remote_target import RemoteTarget
from specdeck.engine.sampling import alternative_chances, logits_to_probs, require_finite, residual
from specdeck.engine.stats import SessionStats


class Refused(NamedTuple):
    """A draft not kept, with its p and q, its depth, what became of it (`TokenState.REJECTED` or
    `DISCARDED`), what a draft with a tokenizer of its own wrote for it, and, for a sampled tree's
    alternative, the chance the rule gave it (not min(1, p/q): it was judged against the residual)."""

    token: int
    p: float
    q: float
    depth: int
    state: TokenState
    piece: DraftPiece | None = None
    chance: float | None = None


@dataclass(frozen=True)
class Verdict:
    """What the target made of a round's drafts, as shown: the kept tokens (the first `accepted`
    of them drafts, the last the target's own, in state `last`), each one's p and q (None where
    nothing drafted it), and the refused drafts, each shown before the kept token at its position or,
    past the kept drafts, before kept token `first_refused`. A draft with a tokenizer of its own
    (`specdeck.engine.drafting.cross_vocab`) adds what it wrote for each kept draft; a sampled tree's accepted
    alternative, the chance it had (`Refused.chance`)."""

    kept: list[int]
    accepted: int
    last: TokenState
    p: list[float]
    q: list[float | None]
    refused: list[Refused]
    first_refused: int
    pieces: list[DraftPiece | None] | None = None
    first_chance: float | None = None  # a sampled tree's accepted alternative (kept[0]): its chance

    @classmethod
    def of(
        cls,
        draft: Draft,
        m: int,
        path: list[int],
        token: int,
        p: torch.Tensor,
        logits: torch.Tensor,
        config: DecodeConfig,
    ) -> Verdict:
        """The verdict on `draft` whose chain passed its first m drafts (`specdeck.engine.loop.decoding.verify`,
        which gave p for the chain's rows), where the round keeps the forward's inputs `path` and
        then `token`."""
        n = len(draft.tokens)
        drafted = draft.tokens + draft.alternatives  # the forward's inputs after the newest kept token
        kept = [drafted[row - 1] for row in path[1:]] + [token]
        accepted = len(path) - 1
        beside = path[-1] > n  # an alternative beside the chain was accepted
        if beside:  # p of the alternative at the first row, of the bonus at the alternative's own
            p_kept = [float(p[0, kept[0]]), float(logits_to_probs(logits[path[1]], config)[kept[1]])]
        else:
            p_kept = p[torch.arange(m + 1, device=p.device), torch.tensor(kept, device=p.device)].tolist()
        last = TokenState.PLAIN if not n else (TokenState.BONUS if beside or m == n else TokenState.RESAMPLED)
        drawn = accepted + (last is TokenState.RESAMPLED)  # tokens with a q: a resampled token has the refused draft's
        proposal = draft.proposal
        q_kept: list[float | None] = [*proposal.q_of(kept[:drawn])] if drawn else []
        pieces = proposal.pieces
        # the first refused, those after
        refused = _refused_drafts(
            draft.tokens[m:], p[m:n], proposal.q_of(draft.tokens)[m:] if m < n else [], m + 1, pieces
        )
        chance = None  # of a sampled alternative kept
        if draft.alternatives and (m == 0 or not config.greedy):
            alternatives, chance = _refused_alternatives(draft, m, kept[0], p[0], config)
            refused += alternatives
        kept_pieces = [pieces[i] if i < accepted and not beside else None for i in range(len(kept))] if pieces else None
        q_kept += [None] * (len(kept) - drawn)
        return cls(kept, accepted, last, p_kept, q_kept, refused, m, kept_pieces, chance)


def _refused_drafts(
    tokens: list[int], p: torch.Tensor, q: list[float], depth: int, pieces: list[DraftPiece] | None = None
) -> list[Refused]:
    """A chain's refused drafts from `depth` on, with their p (one row per draft) and q: the first
    rejected, those after it discarded, never judged."""
    if not tokens:
        return []
    index = torch.tensor(tokens, device=p.device)
    rows = torch.arange(len(tokens), device=p.device)
    states = [TokenState.REJECTED] + [TokenState.DISCARDED] * (len(tokens) - 1)
    figures = zip(tokens, p[rows, index].tolist(), q, states)
    return [
        Refused(t, pv, qv, depth + i, state, pieces[depth + i - 1] if pieces else None)
        for i, (t, pv, qv, state) in enumerate(figures)
    ]


def _refused_alternatives(
    draft: Draft, m: int, first: int, p: torch.Tensor, config: DecodeConfig
) -> tuple[list[Refused], float | None]:
    """A tree's alternatives not kept, all at depth 1 with the first row's p and q, and the chance
    of the kept one where a sampled round kept one. Greedy: the target's argmax decided them all at
    once, rejected (a greedy round shows them where its first draft was refused). Sampled
    (`specdeck.engine.loop.decoding.verify`): tried in turn only after the first draft was refused; those tried
    before the kept one, or all if none was kept, rejected, with the chance each had against the
    residual; the rest never judged, discarded."""
    alternatives = draft.alternatives
    values = zip(alternatives, p[alternatives].tolist(), draft.proposal.q_of(alternatives, row=0))
    if config.greedy:
        return [Refused(t, pv, qv, 1, TokenState.REJECTED) for t, pv, qv in values if t != first], None
    q = draft.proposal.q[0]
    tried = 0 if m else (alternatives.index(first) if first in alternatives else len(alternatives))
    chances = alternative_chances(residual(p, q), alternatives)[0].tolist() if not m else []
    return [
        Refused(t, pv, qv, 1, TokenState.REJECTED, chance=chances[i])
        if i < tried
        else Refused(t, pv, qv, 1, TokenState.DISCARDED)
        for i, (t, pv, qv) in enumerate(values)
        if t != first
    ], (chances[tried] if tried < len(chances) else None)


def _piece_fields(piece: DraftPiece | None) -> dict:
    """A `TokenEvent`'s fields for what a draft with a tokenizer of its own wrote for the token."""
    return {"draft_tokens": piece.tokens, "draft_q": piece.q} if piece is not None else {}


class Transcript:
    """The session's events, the kept text and the counts; and whether and why it stopped."""

    def __init__(self, target: LoadedModel | RemoteTarget, config: DecodeConfig, budget: int) -> None:
        self.eos = target.eos_ids
        self.dtype = target.dtype
        self.stop_strings = config.stop_strings
        self.budget = budget  # new tokens the session may keep
        self.detok = Detokenizer(target.tokenizer)
        self.stats = SessionStats()
        self.new_tokens = 0
        self.rounds = 0
        self.stop_reason = "max_new_tokens" if budget == config.max_new_tokens else "context"
        self.stopped = False

    @property
    def finished(self) -> bool:
        return self.stopped or self.new_tokens >= self.budget

    @property
    def room(self) -> int:
        """Drafts the next round could still keep: the budget left, less the target's own token."""
        return self.budget - self.new_tokens - 1

    def stop(self, reason: str) -> None:
        self.stop_reason = reason
        self.stopped = True

    def start(self, event: SessionStarted) -> SessionStarted:
        self.stats.add(event)
        return event

    def tokens(self, draft: Draft, verdict: Verdict, ids: list[int]) -> list[TokenEvent]:
        """A round's token events, up to a stop; each kept token shown is appended to `ids`."""
        require_finite(verdict.p, self.dtype, self.new_tokens)
        self.rounds += 1
        start = self.new_tokens  # the round's first position
        events: list[TokenEvent] = []
        for i, token in enumerate(verdict.kept):
            shown_here = [r for r in verdict.refused if min(r.depth - 1, verdict.first_refused) == i]
            if shown_here:
                events += self._refused_events(shown_here, draft, start)
            accepted = i < verdict.accepted
            final = token in self.eos or self.new_tokens + 1 == self.budget
            events.append(
                TokenEvent(
                    TokenState.ACCEPTED if accepted else verdict.last,
                    token,
                    self.detok.push(token, final),
                    self.new_tokens,
                    self.rounds,
                    verdict.p[i],
                    verdict.q[i],
                    copied=draft.copied and accepted,
                    depth=i + 1 if accepted else 0,
                    source=draft.proposal.source if accepted else "",
                    chance=verdict.first_chance if i == 0 else None,
                    **_piece_fields(verdict.pieces[i] if verdict.pieces else None),
                )
            )
            ids.append(token)
            self.new_tokens += 1
            if token in self.eos:
                self.stop("eos")
            elif self.stop_strings and any(s in self.detok.text[-64 - len(s) :] for s in self.stop_strings):
                self.stop("stop_string")
            if self.stopped:
                break
        return events

    def _refused_events(self, refused: list[Refused], draft: Draft, start: int) -> list[TokenEvent]:
        """Events for a round's refused drafts (the round starts at position `start`; a draft at depth
        d was proposed for start + d - 1), each rejected or discarded as `Verdict` judged it."""
        texts = self.detok.peek([r.token for r in refused])
        return [
            TokenEvent(
                r.state,
                r.token,
                text,
                start + r.depth - 1,
                self.rounds,
                r.p,
                r.q,
                copied=draft.copied,
                depth=r.depth,
                source=draft.proposal.source,
                chance=r.chance,
                **_piece_fields(r.piece),
            )
            for r, text in zip(refused, texts)
        ]

    def round(
        self, events: list[TokenEvent], draft: Draft, clock: Clock, server: ServerTime | None = None
    ) -> Iterator[Event]:
        """The round's token events, then its `RoundEvent` (made before any is handed out, so that a
        slow reader does not slow the figures), each counted as it goes out; `server`, where the
        round's request went, for a remote target."""
        accepted = sum(1 for e in events if e.state is TokenState.ACCEPTED)
        discarded = sum(1 for e in events if e.state is TokenState.DISCARDED)
        drafted = accepted + discarded + sum(1 for e in events if e.state is TokenState.REJECTED)
        round_event = RoundEvent(
            self.rounds,
            drafted,
            accepted,
            clock.draft_ms,
            clock.verify_ms,
            self.new_tokens,
            clock.decode_s(),
            copied=draft.copied,
            shape=draft.label,
            match_length=draft.proposal.match_length,
            source=draft.proposal.source if drafted else "",
            discarded=discarded,
            draft_tokens=draft.proposal.draft_tokens,
            network_ms=server.network_ms if server else None,
            server_ms=server.server_ms if server else None,
            server_cache_hit=server.cache_hit if server else None,
            recomputed_tokens=server.recomputed_tokens if server else None,
        )
        out: list[Event] = [*events, round_event]
        for event in out:
            self.stats.add(event)
            yield event

    def summary(self, plan: str) -> SummaryEvent:
        self.detok.flush()
        return self.stats.summary(self.detok.text, self.stop_reason, plan)
