"""Session statistics, built from the event stream alone so every front end agrees on them.

- acceptance rate a = accepted / drafted draft tokens;
- mean accepted length = kept tokens per round, the resampled or bonus token included (plain
  decoding scores 1.0);
- predicted speedup (Leviathan et al. 2023, eq. 1 and theorem 3.8): a round of K drafts yields
  (1 - a^(K+1)) / (1 - a) tokens for the cost of K draft forwards and one target forward, so
  speedup = (1 - a^(K+1)) / ((1 - a) (c K + 1)), with c the measured cost of a draft forward
  relative to a target forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdeck.engine.events import RoundEvent, SessionStarted, SummaryEvent, TokenEvent, TokenState


def expected_tokens_per_round(a: float, k: float) -> float:
    """(1 - a^(K+1)) / (1 - a): expected kept tokens per round at acceptance rate a."""
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1.0)) / (1.0 - a)


def predicted_speedup(a: float, k: float, cost_ratio: float) -> float:
    return expected_tokens_per_round(a, k) / (cost_ratio * k + 1.0)


def remote_tokens_per_s(kept: float, k: float, round_trip_ms: float, draft_ms: float, server_ms: float) -> float:
    """Tokens/s against a served target: a round of K drafts keeps `kept` tokens (measured, or
    (1 - a^(K+1)) / (1 - a) at acceptance rate a) for K local draft steps of `draft_ms`, one round
    trip and the server's verify time. Plain decoding over the network keeps one token per round
    trip (kept 1, K 0), or a chunk where the server answers with its own continuation. Speculation pays where `kept` exceeds 1 + K draft_ms / (round_trip_ms +
    server_ms): the longer the round trip, the more."""
    return 1e3 * kept / (k * draft_ms + round_trip_ms + server_ms)


@dataclass
class RoundTotals:
    """Sums over rounds and the figures derived from them: one session's, or a benchmark's."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    new_tokens: int = 0
    draft_ms: float = 0.0
    verify_ms: float = 0.0

    def count(self, event: RoundEvent) -> None:
        """Add one round: its drafts, the accepted ones and its kept tokens (those, the target's
        own token and a served target's continuation after it), and its draft and verify time."""
        self.rounds += 1
        self.drafted += event.drafted
        self.accepted += event.accepted
        self.new_tokens += event.accepted + 1 + event.continued
        self.draft_ms += event.draft_ms
        self.verify_ms += event.verify_ms

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return self.new_tokens / self.rounds if self.rounds else 0.0

    @property
    def cost_ratio(self) -> float | None:
        """c: time of one draft forward over time of one target (verify) forward."""
        if not self.drafted or not self.rounds or self.verify_ms <= 0:
            return None
        return (self.draft_ms / self.drafted) / (self.verify_ms / self.rounds)

    @property
    def predicted_speedup(self) -> float | None:
        c = self.cost_ratio
        if c is None:
            return None
        return predicted_speedup(self.acceptance_rate, self.drafted / self.rounds, c)


@dataclass
class RemoteTotals:
    """A remote target's rounds: where their requests' time went, and the prefix-cache misses the
    server reported (`RoundEvent.network_ms`, `server_ms`, `server_cache_hit`)."""

    rounds: int = 0
    network_ms: float = 0.0
    server_rounds: int = 0
    server_ms: float = 0.0
    reported_cache: int = 0
    misses: int = 0
    recomputed_rounds: int = 0
    recomputed: int = 0

    def add(self, event: RoundEvent) -> None:
        if event.network_ms is None:
            return
        self.rounds += 1
        self.network_ms += event.network_ms
        if event.server_ms is not None:
            self.server_rounds += 1
            self.server_ms += event.server_ms
        if event.server_cache_hit is not None:
            self.reported_cache += 1
            self.misses += not event.server_cache_hit
        if event.recomputed_tokens is not None:
            self.recomputed_rounds += 1
            self.recomputed += event.recomputed_tokens

    @property
    def mean_network_ms(self) -> float | None:
        return self.network_ms / self.rounds if self.rounds else None

    @property
    def mean_server_ms(self) -> float | None:
        return self.server_ms / self.server_rounds if self.server_rounds else None

    @property
    def mean_recomputed_tokens(self) -> float | None:
        """The prompt tokens the server reported computing, per round that reported them."""
        return self.recomputed / self.recomputed_rounds if self.recomputed_rounds else None

    @property
    def cache_misses(self) -> int | None:
        return self.misses if self.reported_cache else None


@dataclass
class SessionStats(RoundTotals):
    """Running totals of one session; feed it every event with `add`."""

    prefill_ms: float = 0.0
    decode_s: float = 0.0
    drafted_at: list[int] = field(default_factory=list)  # per draft depth: times a token was drafted there
    accepted_at: list[int] = field(default_factory=list)
    copied_drafted: int = 0  # drafts that prompt lookup copied (among `drafted`)
    copied_accepted: int = 0
    discarded: int = 0  # drafts never judged: proposed after a rejected draft of their round
    remote: RemoteTotals = field(default_factory=RemoteTotals)
    _round_position: int = 0

    def add(self, event) -> None:
        if isinstance(event, SessionStarted):
            self.prefill_ms = event.prefill_ms
        elif isinstance(event, TokenEvent):
            if event.state.judged:  # acceptance by depth counts the drafts the rule judged there
                i = event.depth - 1 if event.depth else self._round_position  # by depth where events carry it
                while len(self.drafted_at) <= i:
                    self.drafted_at.append(0)
                    self.accepted_at.append(0)
                self.drafted_at[i] += 1
                self.accepted_at[i] += event.state is TokenState.ACCEPTED
                self._round_position += 1
            if event.state.judged or event.state is TokenState.DISCARDED:
                self.copied_drafted += event.copied
                self.copied_accepted += event.copied and event.state is TokenState.ACCEPTED
        elif isinstance(event, RoundEvent):
            self.rounds += 1
            self.drafted += event.drafted
            self.accepted += event.accepted
            self.new_tokens = event.new_tokens
            self.draft_ms += event.draft_ms
            self.verify_ms += event.verify_ms
            self.discarded += event.discarded
            self.decode_s = event.elapsed_s
            self.remote.add(event)
            self._round_position = 0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def accepted_by_position(self) -> tuple[float, ...]:
        return tuple(a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at))

    def summary(self, text: str, stop_reason: str, plan: str = "") -> SummaryEvent:
        return SummaryEvent(
            text=text,
            new_tokens=self.new_tokens,
            rounds=self.rounds,
            drafted=self.drafted,
            accepted=self.accepted,
            acceptance_rate=self.acceptance_rate,
            mean_accepted_length=self.mean_accepted_length,
            tokens_per_s=self.tokens_per_s,
            decode_s=self.decode_s,
            prefill_ms=self.prefill_ms,
            target_forwards_per_token=self.rounds / self.new_tokens if self.new_tokens else 0.0,
            accepted_by_position=self.accepted_by_position,
            predicted_speedup=self.predicted_speedup,
            stop_reason=stop_reason,
            copied_drafted=self.copied_drafted,
            copied_accepted=self.copied_accepted,
            plan=plan,
            discarded=self.discarded,
            network_ms=self.remote.mean_network_ms,
            server_ms=self.remote.mean_server_ms,
            cache_misses=self.remote.cache_misses,
            recomputed_tokens=self.remote.mean_recomputed_tokens,
        )
