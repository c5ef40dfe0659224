"""A benchmark of a served target (`specdeck.engine.remote.remote_target`): where each round's time went (drafting
here, the network, the server) and a latency model of what the measured acceptance and K give at
other round-trip times (`specdeck.engine.stats.remote_tokens_per_s`).

The model: a round of K drafts keeps L tokens (the measured tokens per round, which the measured
acceptance at that K gives: (1 - a^(K+1)) / (1 - a) where acceptance does not depend on depth) and
takes K draft steps, the request measured here (its round trip on this link and the server's
work) and R more milliseconds of round trip; plain decoding over the same link keeps L0 tokens per
request (measured: one scored token, or a chunk of the server's own continuation where the server
continues, `specdeck.engine.remote.remote_continuation`). So tokens/s = 1000 L / (K d + V + R)
against 1000 L0 / (V0 + R), with K the mean drafts per round, d the measured draft time per token,
V the measured request time per round and V0 plain decoding's.
"""

from __future__ import annotations

from specdeck.bench.runner import Method, PromptResult
from specdeck.engine.stats import RemoteTotals, remote_tokens_per_s

ADDED_ROUND_TRIPS_MS = (0, 10, 30, 100, 300)  # a LAN, a region, a continent, across the world
SPLIT_COLUMNS = (
    "method",
    "k",
    "drafter",
    "rounds",
    "draft_ms",
    "round_trip_ms",
    "network_ms",
    "server_ms",
    "recomputed_tokens",
    "no_cache_hit_rounds",
)
LATENCY_COLUMNS = ("method", "k", "drafter", "added_round_trip_ms", "tokens_per_s", "plain_tokens_per_s", "speedup")


def _fmt(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _sums(results: list[PromptResult], method: Method) -> tuple[RemoteTotals, int, int, int, float, float]:
    """A method's median runs summed: request times, rounds, drafted, new tokens, draft and verify ms."""
    remote, rounds, drafted, kept, draft_ms, verify_ms = RemoteTotals(), 0, 0, 0, 0.0, 0.0
    for result in results:
        run = result.median_run(method)
        for name in (
            "rounds",
            "network_ms",
            "server_rounds",
            "server_ms",
            "reported_cache",
            "misses",
            "recomputed_rounds",
            "recomputed",
        ):
            setattr(remote, name, getattr(remote, name) + getattr(run.remote, name))
        rounds, drafted, kept = rounds + run.rounds, drafted + run.drafted, kept + run.new_tokens
        draft_ms, verify_ms = draft_ms + run.draft_ms, verify_ms + run.verify_ms
    return remote, rounds, drafted, kept, draft_ms, verify_ms


def split_rows(results: list[PromptResult], methods: list[Method]) -> list[dict]:
    """Mean milliseconds per round: drafting, the request's round trip, of it the network (the round
    trip less the server's own time, or all of it where the server reports none) and the server;
    the prompt tokens the server reported computing per round (the whole context where it
    recomputed the prefill); and the rounds whose server reported no prefix-cache hit."""
    rows = []
    for method in (m for m in methods if m.name in ("plain", "speculative")):
        remote, rounds, _, _, draft_ms, verify_ms = _sums(results, method)
        if not rounds:
            continue
        recomputed = remote.mean_recomputed_tokens
        rows.append(
            {
                "method": method.name,
                "k": method.shown_k,
                "drafter": method.shown_drafter,
                "rounds": rounds,
                "draft_ms": _fmt(draft_ms / rounds),
                "round_trip_ms": _fmt(verify_ms / rounds),
                "network_ms": _fmt(remote.mean_network_ms),
                "server_ms": _fmt(remote.mean_server_ms) or "not reported",
                "recomputed_tokens": _fmt(recomputed, 1) if recomputed is not None else "not reported",
                "no_cache_hit_rounds": "not reported" if remote.cache_misses is None else remote.cache_misses,
            }
        )
    return rows


def latency_rows(results: list[PromptResult], methods: list[Method]) -> list[dict]:
    """The latency model (module docstring) for each speculative method at each added round trip."""
    _, plain_rounds, _, plain_kept, _, plain_verify = _sums(results, Method("plain"))
    if not plain_rounds:
        return []
    plain_request, plain_per_round = plain_verify / plain_rounds, plain_kept / plain_rounds
    rows = []
    for method in (m for m in methods if m.name == "speculative"):
        _, rounds, drafted, kept, draft_ms, verify_ms = _sums(results, method)
        if not rounds or not drafted:
            continue
        for added in ADDED_ROUND_TRIPS_MS:
            speculative = remote_tokens_per_s(
                kept / rounds, drafted / rounds, added, draft_ms / drafted, verify_ms / rounds
            )
            plain = remote_tokens_per_s(plain_per_round, 0, added, 0.0, plain_request)
            rows.append(
                {
                    "method": method.name,
                    "k": method.shown_k,
                    "drafter": method.shown_drafter,
                    "added_round_trip_ms": added,
                    "tokens_per_s": _fmt(speculative),
                    "plain_tokens_per_s": _fmt(plain),
                    "speedup": _fmt(speculative / plain, 3),
                }
            )
    return rows
