"""The decoding loop: speculative decoding (Leviathan et al. 2023, algorithm 1; Chen et al. 2023)
and plain decoding through the same round, streaming every token's fate as events.

One round, after the kept tokens x_1..x_t:
1. Draft: the drafter proposes d_1..d_K, each drawn from its distribution q_i (its copier, such as
   prompt lookup, copies them instead where the text repeats itself; q is then one-hot). K = 0 is
   a plain step.
2. Verify: ONE target forward over [x_t, d_1..d_K] gives the target's distribution p_i at every
   draft and p_{K+1} after the last one.
3. Accept d_i with probability min(1, p_i(d_i) / q_i(d_i)), in order, until one is refused.
   Correct: the first refused draft is replaced by a draw from norm(max(0, p_i - q_i)), the part
   of p that q under-proposes, so that a position's token follows p_i whatever q was.
   Bonus: when all K pass, p_{K+1} is the target's distribution given every kept token, exactly
   what a plain step would sample from, so its draw comes free from the same forward.
   Greedy is the temperature-0 case: accept while d_i is the target's argmax, which then corrects
   or is the bonus.
A round keeps 1..K+1 tokens for one target forward, and its text is the target's own.

Trees: a round may also verify other first tokens beside d_1 in the same forward (tree
attention). Where d_1 is refused they are tried in turn before the correction (greedy: is the
target's token one of them; sampled: each against the residual, `verify`); an accepted one is
kept and its own row gives the bonus. The round is the same: draft, verify, accept, correct or bonus.

KV cache (`specdeck.engine.forward.kvcache`): between rounds it holds every kept token but the newest, x_t, which
opens the next forward. After a refusal at d_{m+1} it keeps x_t and d_1..d_m, the inputs whose
rows decided a kept token, and drops the refused drafts and anything after them (in a tree, the
branches not taken); the correction or bonus is the new newest token, cached by the next round.

What is not the algorithm lives in `specdeck.engine.loop.rounds` (where drafts come from, the K schedule, the
target's forwards and a feature head's hidden states, timing) and `specdeck.engine.loop.transcript` (events).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Sequence

import torch

from specdeck.engine.cache import costs_cache
from specdeck.engine.config import DecodeConfig
from specdeck.engine.context import context_length, fit_prompt, shortest
from specdeck.engine.cores import fit_threads
from specdeck.engine.drafting.drafters import Drafter
from specdeck.engine.drafting.proposals import Proposal
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.events import Event, SessionStarted
from specdeck.engine.loading.models import LoadedModel
from specdeck.engine.loop.rounds import Clock, Drafts, Schedule, target_forward
from specdeck.engine.loop.transcript import Transcript, Verdict
from specdeck.engine.planner.autotune import MAX_WIDTH, RoundPlanner
from specdeck.engine.planner.costs import cost_curve, draft_cost
from specdeck.engine.remote.remote_target import RemoteTarget, require_greedy
from specdeck.engine.sampling import alternative_chances, argmaxes, logits_to_probs, residual, sample


def verify(
    proposal: Proposal,
    logits: torch.Tensor,
    config: DecodeConfig,
    generator: torch.Generator | None,
    alternatives: Sequence[int] = (),
) -> tuple[int, int, torch.Tensor]:
    """Judge the drafts against the target's logits (len(drafts) + 1 rows), and, where the first
    draft is refused, the tree's `alternatives` to it (other first tokens, none of them the first
    draft nor each other; their own rows are not needed here).

    Returns (accepted count m, the target's own next token, p for every row). With m = 0 the token
    is an alternative where one was accepted (greedy: where the target's argmax is one of them).

    Sampled alternatives are the drafter's likeliest tokens, fixed candidates rather than draws from
    q, so each is tried in turn against the residual r = norm(max(0, p - q)) left by the refused
    first draft (multi-candidate rejection sampling, SpecInfer, Miao et al. 2024; EAGLE, Li et al.
    2024): accept a with probability r(a); on refusal set r(a) = 0 and renormalise; after the last,
    draw from what is left. This keeps the first token ~ p exactly. The first draft alone gives
    P(x) = min(p(x), q(x)) and is refused with probability sum max(0, p - q), after which the token
    must follow r. One candidate a judged against any distribution r gives P(a) = r(a) and, for
    x != a, (1 - r(a)) r(x) / (1 - r(a)) = r(x): the output follows r again, and by induction over
    the candidates so does the whole sequence. An accepted alternative's row then gives the bonus,
    a draw from p given it: the target's distribution after the kept tokens and a.
    """
    p = logits_to_probs(logits, config)
    n = len(proposal.tokens)
    if config.greedy:  # accept while the draft is the target's argmax; the argmax then corrects, or is the bonus
        best = argmaxes(logits)
        m = 0
        while m < n and proposal.tokens[m] == best[m]:
            m += 1
        return m, best[m], p
    drafts = torch.tensor(proposal.tokens, device=p.device, dtype=torch.long)
    rows = torch.arange(n, device=p.device)
    p_draft = p[rows, drafts]
    q_draft = proposal.q[rows, drafts]
    # target prob p, draft prob q: accept with min(1, p/q), i.e. refuse where r q > p for r ~ U(0, 1)
    r = torch.rand(n, generator=generator, device=p.device)
    rejected = (r * q_draft > p_draft).nonzero()
    m = int(rejected[0]) if rejected.numel() else n
    if m == n:  # bonus: p after the last draft is the target's distribution given every kept token
        return m, int(sample(p[n], generator, greedy=False)), p
    # correct: p where q fell short, norm(max(0, p - q)); with the accepts, exactly p
    left = residual(p[m], proposal.q[m])
    if m == 0 and alternatives:  # a tree: each alternative in turn against the residual, refused ones zeroed
        chances, left = alternative_chances(left, list(alternatives))
        taken = (torch.rand(len(alternatives), generator=generator, device=p.device) < chances).nonzero()
        if taken.numel():
            return 0, alternatives[int(taken[0])], p
    return m, int(sample(left, generator, greedy=False)), p


def generate(
    target: LoadedModel | RemoteTarget,
    prompt_ids: list[int],
    config: DecodeConfig,
    drafter: Drafter | None = None,
    cancel: threading.Event | None = None,
) -> Iterator[Event]:
    """Run one session and yield its events; the last is a `SummaryEvent`.

    Setting `cancel` stops the session at the next round boundary, keeping what was generated.
    Prompt and answer stay within the context of the target (and of a draft model): a longer
    prompt is refused or cut (`specdeck.engine.context.fit_prompt`), an answer stops at its end.
    A remote target's server failing (`specdeck.engine.remote.remote_http.ServerFault`, or another `SpecDeckError`
    from a round's request) ends the session with stop reason "server_error": its summary, with the
    text so far, comes out before the error is raised.
    """
    if target.model is None:
        require_greedy(config)
    if target.device.type == "cpu":
        fit_threads()  # the cores other programs leave free now: threads that wait on a busy core stall
    own_context = context_length(target.model) if target.model is not None else None
    context = shortest(own_context, drafter.context_length if drafter else None)
    prompt = fit_prompt(prompt_ids, context, config.max_new_tokens, config.truncate_prompt)
    budget = config.max_new_tokens if context is None else min(config.max_new_tokens, context - len(prompt))
    generator = torch.Generator(device=target.device).manual_seed(config.seed)
    lm = target_forward(target, drafter)
    drafts = Drafts(drafter, config, target.vocab_width, target.device)
    planner = _planner(target, drafter, config, drafts, lm.supports_trees)
    schedule = Schedule(config, drafts.copy_length, planner)
    transcript, clock = Transcript(target, config, budget), Clock(target.device)

    started = clock.now()
    drafts.begin(prompt, generator)
    lm.prefill(prompt, budget)  # the cache: every kept token but the newest, which opens each round's forward
    yield transcript.start(
        SessionStarted(
            "speculative" if drafter else "plain",
            drafts.name,
            len(prompt),
            clock.ms_since(started),
            prompt_tokens_dropped=len(prompt_ids) - len(prompt),
            curve_tokens=planner.curve.tokens if planner else (),
            curve_ms=planner.curve.forward_ms if planner else (),
            draft_ms=planner.draft_ms_per_token if planner else 0.0,
            runs=target.runs,
        )
    )
    ids = list(prompt)
    while not transcript.finished:
        if cancel is not None and cancel.is_set():
            transcript.stop("cancelled")
            break
        clock.start_round()
        shape = schedule.plan()
        # 1. Draft: up to K tokens, each with the distribution q it was drawn from (none: a plain step).
        draft = drafts.propose(ids, shape, room=transcript.room, judge=schedule.judge)
        clock.drafted()
        # 2. Verify: ONE target forward over [newest kept token, drafts] gives p at every draft and
        #    after the last (in a tree, also at the alternatives beside the first draft).
        try:
            draft = lm.admit(ids[-1], draft)  # a server that takes text verifies what it reads back alone
            logits = lm.forward(ids[-1], draft)
        except SpecDeckError as fault:  # a remote target's server failed, or cannot be given the text
            transcript.stop("server_error")
            yield transcript.summary(schedule.describe())
            raise type(fault)(f"{fault} The {transcript.new_tokens} tokens written before it are kept.") from fault
        n = len(draft.tokens)
        # 3. Accept each draft with probability min(1, p/q) until one is refused: m accepted. `token`
        #    corrects the refused one, drawn from norm(max(0, p - q)); or, when all n passed, it is the
        #    bonus, drawn from p after the last draft: the target's distribution given every kept token.
        #    In a tree whose first draft was refused, its alternatives are tried before the correction.
        m, token, p = verify(draft.proposal, logits[: n + 1], config, generator, draft.alternatives)
        path = list(range(m + 1))  # the forward's inputs kept: the newest kept token, the accepted drafts
        if m == 0 and token in draft.alternatives:  # a tree: an alternative to the first draft was accepted;
            path = [0, n + 1 + draft.alternatives.index(token)]  # its own row gives the bonus, the target's
            token = _bonus(logits[path[1]], config, generator)  # token after it
        # 4. The cache keeps `path`, so it again holds every kept token but the newest (`token`); what
        #    the refused drafts and the branches not taken left there is dropped.
        lm.keep(path)
        verdict = Verdict.of(draft, m, path, token, p, logits, config)
        clock.verified()
        events = transcript.tokens(draft, verdict, ids)
        schedule.record(shape, draft, m, clock, verdict.kept[0])
        yield from transcript.round(events, draft, clock, lm.server_time)
    drafts.end(ids)
    yield transcript.summary(schedule.describe())


def _bonus(logits: torch.Tensor, config: DecodeConfig, generator: torch.Generator | None) -> int:
    """The target's token after an accepted alternative, from the alternative's own row: its argmax
    (greedy), or a draw from p there."""
    if config.greedy:
        return argmaxes(logits.unsqueeze(0))[0]
    return int(sample(logits_to_probs(logits, config), generator, greedy=False))


# each drafter's latest greedy planner, by the drafter's model (else the target's) and the drafting's name
_PLANNERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _planner(
    target: LoadedModel | RemoteTarget, drafter: Drafter | None, config: DecodeConfig, drafts: Drafts, trees: bool
) -> RoundPlanner | None:
    """The auto schedule's planner (None under the others, and for plain decoding): each round's
    shape chosen from the costs measured on this machine (cached) and the session's acceptance, with
    alternatives to the first draft (a tree) where `trees` can run. Greedy sessions also adapt the
    costs to what their rounds take (their text cannot change with the shape); sampled ones plan
    from the cached costs alone, so a seed gives the same text on this machine."""
    if drafter is None or config.schedule != "auto" or isinstance(target, RemoteTarget):
        return None  # (a served target's costs are not measured here)
    costs = costs_cache()
    per_token = draft_cost(drafter, target.vocab_width, target.model.config.hidden_size, costs)
    planner = RoundPlanner(
        cost_curve(target.model, costs),
        per_token,
        config.max_k,
        drafts.copy_length,
        adapt=config.greedy,
        max_width=MAX_WIDTH if trees else 1,
    )
    if config.greedy:  # greedy text cannot depend on it; a seed's would
        # a model drafter's by its model; a drafter that only copies (its acceptance is the target's
        # agreement with the text) by the target's, one per kind of drafter
        owner = drafter.module if drafter.module is not None else target.model
        planners = _PLANNERS.setdefault(owner, {})
        earlier = planners.get(drafts.name)
        if earlier is not None:
            planner.carry_over(earlier)
        planners[drafts.name] = planner
    return planner
