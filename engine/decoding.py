"""The decoding loop: speculative decoding (Leviathan et al. 2023; Chen et al. 2023) and plain
decoding through the same machinery, streaming every token's fate as events.

One round: the drafter proposes up to K tokens (or, with `lookup`, prompt lookup copies tokens
where the text repeats itself); the target scores all of them in ONE forward over
its KV cache; drafts are kept while the rejection rule accepts them; the first rejected one is
replaced by a token from the corrected distribution, or, when every draft passed, the target's
next token comes free from the same forward. Plain decoding is the same round with no drafter.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator

import torch

from engine.autotune import MAX_WIDTH, RoundPlanner, Shape, cost_curve, draft_cost
from engine.cache import costs_cache
from engine.config import DecodeConfig
from engine.context import context_length, fit_prompt, shortest
from engine.detok import Detokenizer
from engine.drafters import Drafter, DraftPiece, Proposal
from engine.events import Event, RoundEvent, SessionStarted, TokenEvent, TokenState
from engine.kvcache import CachedModel, synchronize
from engine.models import LoadedModel
from engine.sampling import logits_to_probs, require_finite, residual, sample
from engine.stats import SessionStats


def verify(proposal: Proposal, logits: torch.Tensor, config: DecodeConfig,
           generator: torch.Generator | None) -> tuple[int, int, torch.Tensor]:
    """Judge the drafts against the target's logits (len(drafts) + 1 rows).

    Returns (accepted count m, the target's own next token, p for every row).
    Greedy: accept while the draft equals the target's argmax; the next token is the argmax at
    the first mismatch, or after the last draft (the bonus).
    Sampling: target prob p, draft prob q: accept with min(1, p/q); on rejection draw from
    norm(max(0, p - q)); if all pass, the bonus comes from p at the last row, which is the
    target's distribution given every accepted token, so the output follows p exactly.
    """
    p = logits_to_probs(logits, config)
    n = len(proposal.tokens)
    if config.greedy:
        best = logits.argmax(dim=-1).tolist()
        m = 0
        while m < n and proposal.tokens[m] == best[m]:
            m += 1
        return m, best[m], p
    drafts = torch.tensor(proposal.tokens, device=p.device, dtype=torch.long)
    rows = torch.arange(n, device=p.device)
    p_draft = p[rows, drafts]
    q_draft = proposal.q[rows, drafts]
    r = torch.rand(n, generator=generator, device=p.device)
    rejected = (r * q_draft > p_draft).nonzero()
    m = int(rejected[0]) if rejected.numel() else n
    if m < n:
        token = sample(residual(p[m], proposal.q[m]), generator, greedy=False)
    else:
        token = sample(p[n], generator, greedy=False)
    return m, int(token), p


def generate(target: LoadedModel, prompt_ids: list[int], config: DecodeConfig,
             drafter: Drafter | None = None, cancel: threading.Event | None = None) -> Iterator[Event]:
    """Run one session and yield its events; the last is a `SummaryEvent`.

    Setting `cancel` stops the session at the next round boundary, keeping what was generated.
    Prompt and answer stay within the context of the target (and of a draft model): a longer
    prompt is refused or cut (`engine.context.fit_prompt`), an answer stops at its end.
    """
    context = shortest(context_length(target.model), drafter.context_length if drafter else None)
    given = len(prompt_ids)
    prompt_ids = fit_prompt(prompt_ids, context, config.max_new_tokens, config.truncate_prompt)
    budget = config.max_new_tokens if context is None else min(config.max_new_tokens, context - len(prompt_ids))
    device = target.device
    generator = torch.Generator(device=device).manual_seed(config.seed)
    lm = CachedModel(target.model, taps=drafter.feature_layers if drafter is not None else ())
    eos = target.eos_ids
    detok = Detokenizer(target.tokenizer)
    stats = SessionStats()

    copies = drafter is not None and config.lookup > 0 and not drafter.copies_text
    # trees (alternatives beside the first draft): greedy only, on a backend with tree attention
    tree = config.schedule == "auto" and config.greedy and lm.supports_trees
    planner = _planner(target, drafter, config, copies, tree) if drafter is not None and config.schedule == "auto" else None

    synchronize(device)
    started = time.perf_counter()
    states = drafter is not None and drafter.needs_states
    if drafter is not None:
        drafter.begin(prompt_ids, config, target.vocab_width, generator)
    copier = drafter.copier(device) if copies else None  # tried before the drafter (prompt lookup, a hybrid's suffix)
    if copier:
        copier.begin(prompt_ids, config, target.vocab_width, generator)
    if len(prompt_ids) > 1:  # cache: every kept token but the newest
        if states:
            drafter.observe(lm.states(lm.forward_hidden(prompt_ids[:-1])))
        else:
            lm.forward(prompt_ids[:-1], last_only=True)
    synchronize(device)
    prefill_ms = (time.perf_counter() - started) * 1e3
    name = (drafter.name + (f" + {copier.name}" if copier else "")) if drafter else ""
    start = SessionStarted("speculative" if drafter else "plain", name, len(prompt_ids), prefill_ms,
                           prompt_tokens_dropped=given - len(prompt_ids))
    stats.add(start)
    yield start

    ids = list(prompt_ids)
    new_tokens = 0
    k = config.k
    stop_reason = "max_new_tokens" if budget == config.max_new_tokens else "context"
    decode_started = time.perf_counter()
    round_no = 0
    while new_tokens < budget:
        if cancel is not None and cancel.is_set():
            stop_reason = "cancelled"
            break
        round_no += 1
        round_started = time.perf_counter()
        room = budget - new_tokens - 1  # drafts beyond this could never be kept
        shape = planner.plan() if planner else Shape(config.lookup if copier else 0, k, 1)
        proposal, copied = _draft(ids, drafter, copier, shape, room)
        if proposal is None:
            proposal = Proposal([], torch.zeros(0, target.vocab_width, device=device))
        alternatives = proposal.alternatives(shape.width) if tree and not copied else []
        synchronize(device)
        verify_started = time.perf_counter()
        n = len(proposal.tokens)
        if alternatives:  # a tree: the chain, and other first tokens beside its first
            hidden = lm.forward_tree([ids[-1]] + proposal.tokens + alternatives,
                                     list(range(-1, n)) + [0] * len(alternatives))
            logits = lm.logits(hidden)
        elif states:
            hidden = lm.forward_hidden([ids[-1]] + proposal.tokens)
            logits = lm.logits(hidden)
        else:
            logits = lm.forward([ids[-1]] + proposal.tokens)
        m, token, p = verify(proposal, logits[: n + 1], config, generator)
        picked = m == 0 and token in alternatives  # greedy: the target's first token was an alternative
        if picked:
            row = n + 1 + alternatives.index(token)
            p_row = logits_to_probs(logits[row], config)
            kept, path = [token, int(logits[row].argmax())], [0, row]
            p_kept = [float(p[0, token]), float(p_row[kept[1]])]
            q_kept = [float(proposal.q[0, token])]
            m, last_state = 1, TokenState.BONUS
            lm.compact(path)
        else:
            kept, path = proposal.tokens[:m] + [token], list(range(m + 1))
            p_kept = p[torch.arange(m + 1, device=p.device), torch.tensor(kept, device=p.device)].tolist()
            q_kept = proposal.q[torch.arange(m), torch.tensor(kept[:m], device=p.device)].tolist() if m else []
            last_state = TokenState.PLAIN if n == 0 else (TokenState.BONUS if m == n else TokenState.RESAMPLED)
            lm.crop(len(ids) + m)  # keep the newest kept token (`token`) out of the cache
        require_finite(p_kept, target.dtype, new_tokens)
        first_refused = 0 if picked else m  # the chain's drafts from here on were refused or unreachable
        rejected = _judged(proposal.tokens[first_refused:], p[first_refused:n], proposal.q[first_refused:n],
                           first_refused + 1, proposal.pieces)
        if first_refused == 0 and alternatives:  # the alternatives the target did not take (shown only where all were judged)
            rejected += _judged([t for t in alternatives if t != token], p[0], proposal.q[0], 1)
        if states:
            drafter.observe(lm.states(hidden)[path])  # the kept tokens of this forward
        synchronize(device)
        verify_ms = (time.perf_counter() - verify_started) * 1e3
        draft_ms = (verify_started - round_started) * 1e3

        events: list[Event] = []
        stopped = None
        for i, token_id in enumerate(kept):
            if rejected and i == first_refused:  # refused drafts where they were proposed, first
                events.extend(_rejected_events(rejected, detok, new_tokens - first_refused, round_no, copied,
                                               proposal.source))
            if i < m:
                state, q = TokenState.ACCEPTED, q_kept[i]
            else:
                state, q = last_state, (float(proposal.q[m, token_id]) if m < n and not picked else None)
            final = token_id in eos or new_tokens + 1 == budget
            piece = proposal.pieces[i] if proposal.pieces and i < m and not picked else None
            events.append(TokenEvent(state, token_id, detok.push(token_id, final), new_tokens, round_no, p_kept[i], q,
                                     copied=copied and i < m, depth=i + 1 if i < m else 0,
                                     source=proposal.source if i < m else "", **_piece_fields(piece)))
            ids.append(token_id)
            new_tokens += 1
            if token_id in eos:
                stopped = "eos"
            elif config.stop_strings and any(s in detok.text[-64 - len(s):] for s in config.stop_strings):
                stopped = "stop_string"
            if stopped:
                break
        # a stop inside the round cuts it short: count only the drafts whose fate was shown
        accepted, drafted, discarded = _draft_counts(events)
        if planner:
            first = int(logits[0].argmax())  # the target's own first token: its rank among the drafter's
            rank = proposal.rank(first) if n and not copied else None
            planner.record(shape, copied, n, first_refused, draft_ms, verify_ms,
                           (time.perf_counter() - round_started) * 1e3, rank, len(alternatives))
        round_event = RoundEvent(round_no, drafted, accepted, draft_ms, verify_ms, new_tokens,
                                 time.perf_counter() - decode_started, copied=copied,
                                 shape=_label(n, copied, len(alternatives)), match_length=proposal.match_length,
                                 discarded=discarded, draft_tokens=proposal.draft_tokens)
        for event in events:
            stats.add(event)
            yield event
        stats.add(round_event)
        yield round_event
        if stopped:
            stop_reason = stopped
            break
        if config.schedule == "heuristic" and n and not copied:
            k = min(k + 2, config.max_k) if m == n else max(1, k - 1)

    for ended in (drafter, copier):
        if ended is not None:
            ended.end(ids)
    detok.flush()
    yield stats.summary(detok.text, stop_reason, planner.describe() if planner else "")


_PLANNERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # each drafter's latest greedy planner


def _planner(target: LoadedModel, drafter: Drafter, config: DecodeConfig, copies: bool, tree: bool) -> RoundPlanner:
    """The auto schedule: each round's shape chosen from the costs measured on this machine (cached)
    and the session's acceptance. Greedy sessions also adapt the costs to what their rounds take
    (their text cannot change with the shape); sampled ones plan from the cached costs alone, so a
    seed gives the same text on this machine."""
    costs = costs_cache()
    per_token = draft_cost(drafter, target.vocab_width, target.model.config.hidden_size, costs)
    planner = RoundPlanner(cost_curve(target.model, costs), per_token, config.max_k, config.lookup if copies else 0,
                           adapt=config.greedy, max_width=MAX_WIDTH if tree else 1)
    if config.greedy and drafter.module is not None:  # greedy text cannot depend on it; a seed's would
        earlier = _PLANNERS.get(drafter.module)
        if earlier is not None:
            planner.carry_over(earlier)
        _PLANNERS[drafter.module] = planner
    return planner


def _draft(ids: list[int], drafter: Drafter | None, copier: Drafter | None, shape: Shape,
           room: int) -> tuple[Proposal | None, bool]:
    """This round's drafts: copied by the copier where the text repeats, else the drafter's;
    (None, False) when the round drafts nothing. Never more than `room`, what could still be kept."""
    if drafter is None or room <= 0:
        return None, False
    if copier is not None and shape.copy:
        proposal = copier.propose(ids, min(shape.copy, room))
        if proposal.tokens:
            return proposal, True
    if shape.k:
        return drafter.propose(ids, min(shape.k, room)), False
    return None, False


def _label(drafted: int, copied: bool, alternatives: int = 0) -> str:
    """A round's shape as shown in events: "K=2", "K=2 w3" (a tree: three candidates for the first
    token, the chain under the first), "copy 3" or "none"."""
    if not drafted:
        return "none"
    if copied:
        return f"copy {drafted}"
    return f"K={drafted}" + (f" w{alternatives + 1}" if alternatives else "")


Judged = tuple[int, float, float, int, DraftPiece | None]  # a refused draft: token, p, q, depth, what a draft wrote


def _judged(tokens: list[int], p: torch.Tensor, q: torch.Tensor, depth: int,
            pieces: list[DraftPiece] | None = None) -> list[Judged]:
    """(token, p, q, depth, piece) for drafts the target refused: one row of p and q per token from
    `depth` on (a chain, whose pieces are the proposal's from `depth` on), or one row for all
    (alternatives, all at `depth`)."""
    if not tokens:
        return []
    index = torch.tensor(tokens, device=p.device)
    if p.dim() == 1:
        return [(t, pv, qv, depth, None) for t, pv, qv in zip(tokens, p[index].tolist(), q[index].tolist())]
    rows = torch.arange(len(tokens), device=p.device)
    return [(t, pv, qv, depth + i, pieces[depth + i - 1] if pieces else None) for i, (t, pv, qv) in
            enumerate(zip(tokens, p[rows, index].tolist(), q[rows, index].tolist()))]


def _piece_fields(piece: DraftPiece | None) -> dict:
    """A `TokenEvent`'s fields for what a draft with a tokenizer of its own wrote for the token."""
    return {"draft_tokens": piece.tokens, "draft_q": piece.q} if piece is not None else {}


def _rejected_events(rejected: list[Judged], detok: Detokenizer, start: int, round_no: int,
                     copied: bool, source: str) -> list[TokenEvent]:
    """Events for a round's refused drafts, each at the position it was proposed for (`start` is
    the round's first position; a draft at depth d was proposed for start + d - 1). The first of
    the chain was judged and rejected; the chain's drafts after it were never judged (discarded);
    a tree's alternatives beside the first draft were judged against the target's token."""
    texts = detok.peek([token for token, *_ in rejected])
    first_depth = rejected[0][3]
    return [TokenEvent(TokenState.REJECTED if i == 0 or depth == first_depth else TokenState.DISCARDED, token, text,
                       start + depth - 1, round_no, pv, qv, copied=copied, depth=depth, source=source,
                       **_piece_fields(piece))
            for i, ((token, pv, qv, depth, piece), text) in enumerate(zip(rejected, texts))]


def _draft_counts(events: list[TokenEvent]) -> tuple[int, int, int]:
    """(accepted, drafted, discarded) among a round's token events: the drafts whose fate was shown."""
    accepted = sum(1 for e in events if e.state is TokenState.ACCEPTED)
    rejected = sum(1 for e in events if e.state is TokenState.REJECTED)
    discarded = sum(1 for e in events if e.state is TokenState.DISCARDED)
    return accepted, accepted + rejected + discarded, discarded
