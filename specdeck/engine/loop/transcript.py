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
string) cuts a round short, and its counts hold the shown drafts only. A served target's
continuation (`Verdict`) adds kept tokens after the target's own, shown plain.
"""

from __future__ import annotations

from collections.abc import Iterator

from specdeck.engine.config import DecodeConfig
from specdeck.engine.drafting.proposals import DraftPiece
from specdeck.engine.events import Event, RoundEvent, SessionStarted, SummaryEvent, TokenEvent, TokenState
from specdeck.engine.loading.models import LoadedModel
from specdeck.engine.loop.clock import Clock
from specdeck.engine.loop.detok import Detokenizer
from specdeck.engine.loop.draft_tree import DraftTree
from specdeck.engine.loop.verification import Refused, Verdict
from specdeck.engine.remote.remote_scoring import ServerTime
from specdeck.engine.remote.remote_target import RemoteTarget
from specdeck.engine.sampling import require_finite
from specdeck.engine.stats import SessionStats


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

    def tokens(self, draft: DraftTree, verdict: Verdict, ids: list[int]) -> list[TokenEvent]:
        """A round's token events, up to a stop; each kept token shown is appended to `ids`."""
        require_finite(verdict.p, self.dtype, self.new_tokens)
        self.rounds += 1
        start = self.new_tokens  # the round's first position
        events: list[TokenEvent] = []
        for i, token in enumerate(verdict.kept):
            shown_here = [r for r in verdict.refused if min(r.depth - 1, verdict.chain_accepted) == i]
            if shown_here:
                events += self._refused_events(shown_here, draft, start)
            accepted = i < verdict.accepted
            final = token in self.eos or self.new_tokens + 1 == self.budget
            # past the target's own token, a served target's continuation: its text, no draft judged
            state = TokenState.ACCEPTED if accepted else verdict.last if i == verdict.accepted else TokenState.PLAIN
            events.append(
                TokenEvent(
                    state,
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

    def _refused_events(self, refused: list[Refused], draft: DraftTree, start: int) -> list[TokenEvent]:
        """Events for a round's refused drafts (the round starts at position `start`; a draft at depth
        d was proposed for start + d - 1), each rejected or discarded as the verdict says."""
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
        self, events: list[TokenEvent], draft: DraftTree, clock: Clock, server: ServerTime | None = None
    ) -> Iterator[Event]:
        """The round's token events, then its `RoundEvent` (made before any is handed out, so that a
        slow reader does not slow the figures), each counted as it goes out; `server`, where the
        round's request went, for a remote target."""
        accepted = sum(1 for e in events if e.state is TokenState.ACCEPTED)
        discarded = sum(1 for e in events if e.state is TokenState.DISCARDED)
        drafted = accepted + discarded + sum(1 for e in events if e.state is TokenState.REJECTED)
        kept = sum(1 for e in events if e.state.kept)
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
            continued=max(kept - accepted - 1, 0),
        )
        out: list[Event] = [*events, round_event]
        for event in out:
            self.stats.add(event)
            yield event

    def summary(self, plan: str) -> SummaryEvent:
        self.detok.flush()
        return self.stats.summary(self.detok.text, self.stop_reason, plan)
