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

The round's parts, each in its module of `specdeck.engine.loop`: `schedule` (each round's shape),
`drafting_step` (copy first, then the drafter), `target_forward` (the forward over the KV cache, or a
server's), `verification` (the acceptance rule and its verdict), `clock` (the round's times) and
`transcript` (the events a front end reads).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import torch

from specdeck.engine.config import DecodeConfig
from specdeck.engine.context import context_length, fit_prompt, shortest
from specdeck.engine.cores import fit_threads
from specdeck.engine.drafting.drafters import Drafter
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.events import Event, SessionStarted
from specdeck.engine.loading.models import LoadedModel
from specdeck.engine.loop.clock import Clock
from specdeck.engine.loop.drafting_step import DraftingStep
from specdeck.engine.loop.schedule import session_schedule
from specdeck.engine.loop.target_forward import TargetForward, target_forward
from specdeck.engine.loop.transcript import Transcript
from specdeck.engine.loop.verification import verify
from specdeck.engine.remote.remote_target import RemoteTarget, require_greedy


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
    A remote target's server failing (`specdeck.engine.remote.remote_http.ServerFault`, or another
    `SpecDeckError` from a round's request) ends the session with stop reason "server_error": its
    summary, with the text so far, comes out before the error is raised.
    A greedy session that planned from a first estimate of the target's costs measures them after
    its summary, on its own KV cache (`Schedule.settle`), as the caller asks for what follows it.
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
    drafting = DraftingStep(drafter, config, target.vocab_width, target.device)
    own_cache = lm.lm if isinstance(lm, TargetForward) else None  # the costs are measured on it, before the prompt
    schedule = session_schedule(
        target, drafter, config, drafting.name, drafting.copy_length, lm.supports_trees, own_cache
    )
    planner = schedule.planner
    transcript, clock = Transcript(target, config, budget), Clock(target.device)

    started = clock.now()
    drafting.begin(prompt, generator)
    lm.prefill(prompt, budget)  # the cache: every kept token but the newest, which opens each round's forward
    yield transcript.start(
        SessionStarted(
            "speculative" if drafter else "plain",
            drafting.name,
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
        # 1. Draft: up to K tokens, each with the distribution q it was drawn from (none: a plain step);
        #    copied from the text instead where it repeats and the copy pays.
        draft = drafting.propose(ids, shape, transcript.room, schedule)
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
        # 3. Accept each draft with probability min(1, p/q) until one is refused: m accepted. The
        #    target's own token corrects the refused one, drawn from norm(max(0, p - q)); or, when all
        #    passed, it is the bonus, drawn from p after the last draft: the target's distribution
        #    given every kept token. In a tree whose first draft was refused, its alternatives are
        #    tried before the correction.
        #    A server that answered with its own greedy continuation has it all kept.
        verdict = verify(draft, logits, config, generator, continuation=lm.continued)
        # 4. The cache keeps the verdict's path (the newest kept token's row, the accepted drafts'), so
        #    it again holds every kept token but the newest; what the refused drafts and the branches
        #    not taken left there is dropped.
        lm.keep(verdict.path, verdict.kept)
        clock.verified()
        events = transcript.tokens(draft, verdict, ids)
        schedule.record(shape, draft, verdict.chain_accepted, clock, verdict.kept[0])
        yield from transcript.round(events, draft, clock, lm.server_time)
    drafting.end(ids)
    yield transcript.summary(schedule.describe())
    if not (cancel is not None and cancel.is_set()):  # after the text, where it costs no token a wait
        schedule.settle()
