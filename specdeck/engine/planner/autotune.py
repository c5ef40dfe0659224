"""Choosing each round's draft length from what this machine and this drafter measure.

A round that drafts K tokens keeps E(K) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_K tokens on average,
where a_d is the chance the d-th draft is accepted once the ones before it were (Leviathan et al.
2023, section 3.1, with acceptance by depth instead of one rate). It costs
T(K) = overhead + K c + V(K + 1): the drafter's cost per token c, and the target's forward over the
newest kept token and K drafts, V, which depends on the machine (flat on some CPUs up to 16 tokens,
steep on others: `specdeck.engine.forward.linear`). The planner picks the K in [0, max K] that maximises E(K) / T(K),
K = 0 being a plain step. Copies from text (prompt lookup, the suffix drafter) cost no drafting
and are judged once found (`RoundPlanner.copy_length`): each is verified as far as its expected
kept tokens per ms beat the planned round, with acceptance estimated by where it was copied from,
how long its match is and whether the text went on otherwise after it (`CopyAcceptance`).

V comes from a cost curve measured once per model, device and machine (a second or two, after a
greedy session's text or before a sampled one's first token, then cached on disk) and scaled by
what the session's verifies actually take; c, the overhead and the acceptances are measured as
the session runs, with older rounds weighing less.
"""

from __future__ import annotations

from collections.abc import Sequence

from specdeck.engine.planner.acceptance import DECAY, PRIOR, CopyAcceptance, DepthAcceptance
from specdeck.engine.planner.costs import SETTLE, CostCurve
from specdeck.engine.planner.round_shape import Shape, round_label

PROBE_EVERY = 8  # rounds at least between one-token drafts while the planner has chosen not to draft
# the share of plain rounds' time that probes may lose, at most (expected): a probe also slows the
# steps after it and, on a feature head, first pairs the states since its last draft
PROBE_BUDGET = 0.01
MAX_WIDTH = 4  # candidates for a round's first token, at most
DEEPER = 2  # drafts a confident chain may go past the planned K (`RoundPlanner.with_floors`)
# model drafts a drafter's first session verifies, whatever the estimates say: it measures the
# drafter's acceptance (and a user sees the drafts' colours) even where drafting seldom pays; later
# sessions start from what it measured (`RoundPlanner.carry_over`)
EXPLORE = 2
CARRIED = 8.0  # rounds' weight of an earlier session's acceptance in a new one (`RoundPlanner.carry_over`)
AFTERMATH = 3  # plain steps after a round that verified drafts charged to it (`RoundPlanner.aftermath`)
# a round measured this many times what the planner expects was held up by something else (the
# collector, a graph capture, another process): it moves an estimate as if it took this many times,
# and a step that slow is no drafts' aftermath, or one outlier could stop drafting for good
HELD_UP = 2.0


class RoundPlanner:
    """Picks each round's `Shape` to maximise expected kept tokens per millisecond."""

    def __init__(
        self,
        curve: CostCurve,
        draft_ms_per_token: float,
        max_k: int,
        max_copy: int,
        adapt: bool = True,
        max_width: int = MAX_WIDTH,
    ) -> None:
        self.curve = curve
        self.adapt = adapt  # False: plan from the cached costs alone, so a seed repeats its choices
        self.max_k = max(0, min(max_k, curve.tokens[-1] - 1))
        self.max_copy = max(0, min(max_copy, curve.tokens[-1] - 1))
        self.drafts = DepthAcceptance()
        self.copies = CopyAcceptance()
        self.planned_rate = 0.0  # kept tokens per ms of the round `plan` chose, which a copy must beat
        self.draft_ms_per_token = draft_ms_per_token
        # the loop's own time per round beside the draft and the verify, for plain steps and for
        # rounds that verify drafts apart: these judge drafts and build more events, so priced alike
        # drafts would look cheaper than they are
        self.overhead_ms = 0.0
        self.drafted_overhead_ms = 0.0
        # the curve at every verify size a round may plan (read for each shape weighed, every round)
        self._curve_ms = [curve.ms(n) for n in range(self.max_k + max_width + DEEPER + 2)]
        self.scale = 1.0  # the session's verify times over the curve's: the machine's pace now
        # each verify size's time (tokens verified, whether a tree) over the curve's at that pace, as
        # this session measured it: a size measured once stays right when the machine's pace changes
        # (a session whose rounds all drafted still knows what a plain step costs now, not what the
        # slow steps after its prefill cost). A tree's side branches attend apart, so a tree of n
        # tokens costs a little more than a chain of n
        self.shapes: dict[tuple[int, bool], float] = {}
        self.tree_scale = 1.0  # a tree's verify time over a chain's of as many tokens, for trees not verified yet
        self.rounds_without_draft = 0
        self.explored = 0  # model drafts this session verified (`EXPLORE`)
        self.chosen: dict[str, int] = {}  # "K=2", "K=2 w3", "copy 4", "none": rounds
        self.max_width = max_width  # 1 where trees cannot run (sampling, a backend without tree attention)
        self.ranks = [0.0] * MAX_WIDTH  # decayed rounds in which the target's first token had each rank
        self.ranked = 0.0
        # decayed rounds that planned a model's drafts, and those whose first draft fell below its floor
        # (`with_floors`): drafted, then not verified, so the round was a plain step that paid for a draft
        self.planned_drafts = 0.0
        self.refusals = 0.0
        # What a round that verified drafts costs the plain steps after it, by kind ("model" drafts,
        # "copy"): a draft's weights and a wider verify push the target's out of the caches. Measured
        # as the excess of the AFTERMATH plain steps that follow it over `clean_ms`, the plain steps
        # after as many plain steps; charged to the kind's rounds, once a run (`charged_aftermath_ms`).
        self.aftermath: dict[str, float] = {}
        self.clean_ms: float | None = None
        # the kind of the last round that verified drafts and how many of its AFTERMATH plain steps
        # are still to come: what they pay is owed whatever the next round does (`charged_aftermath_ms`)
        self.owed: tuple[str, int] = ("", 0)
        # rounds in a row that verified drafts: the current run's, and the runs' decayed mean (prior:
        # one), over which a run's one aftermath is spread when it starts (`charged_aftermath_ms`)
        self.run_rounds = 0
        self.run_length = 1.0
        self._since_drafts = AFTERMATH
        self._last_kind = ""
        self._excess = 0.0

    def verify_ms(self, n: int, tree: bool = False) -> float:
        """A verify over n tokens (a tree of them if `tree`): the curve at this session's pace, times
        what this session measured for that size against it (a tree not measured yet: a chain's at
        the trees' measured ratio)."""
        paced = (self._curve_ms[n] if n < len(self._curve_ms) else self.curve.ms(n)) * self.scale
        chain = paced * self.shapes.get((n, False), 1.0)
        if not tree:
            return chain
        measured = self.shapes.get((n, True))
        return paced * measured if measured is not None else chain * self.tree_scale

    def aftermath_ms(self, kind: str) -> float:
        """What a round of this kind ("model", "copy") costs the plain steps after it (0 until measured)."""
        return max(0.0, self.aftermath.get(kind, 0.0))

    def charged_aftermath_ms(self, kind: str) -> float:
        """What a round of this kind is charged for the plain steps after it. The first plain steps
        after a run of drafting rounds pay one aftermath whenever the run ends: a round that goes on
        with the run is charged only what its kind adds over the part the last round still owes,
        and a round that starts a run its aftermath spread over the rounds runs have lasted."""
        owed_kind, steps = self.owed
        owed = self.aftermath_ms(owed_kind) * steps / AFTERMATH if owed_kind else 0.0
        return max(0.0, self.aftermath_ms(kind) - owed) / max(1.0, self.run_length)

    def _note_aftermath(self, drafted: int, copied: bool, verify_ms: float) -> None:
        """Follow the plain steps after each round that verified drafts (see `aftermath`)."""
        if drafted:  # the rounds after the last one are done being its aftermath
            self._fold()
            self._since_drafts, self._last_kind, self._excess = 0, "copy" if copied else "model", 0.0
            return
        if self._since_drafts >= AFTERMATH:
            if self.clean_ms is None:
                self.clean_ms = verify_ms
            elif verify_ms < HELD_UP * self.clean_ms:
                self.clean_ms = 0.8 * self.clean_ms + 0.2 * verify_ms
            return
        baseline = self.clean_ms if self.clean_ms is not None else self.plain_ms()
        if verify_ms >= HELD_UP * baseline:
            self._last_kind = ""  # held up by something else: this round's aftermath is not measured
        self._excess += verify_ms - baseline
        self._since_drafts += 1
        if self._since_drafts == AFTERMATH:
            self._fold()

    def _fold(self) -> None:
        """The last drafting round's aftermath, once its plain steps are measured, into its kind's."""
        if self._last_kind and self._since_drafts and self.clean_ms is not None:
            share = self._excess * AFTERMATH / self._since_drafts  # as if all AFTERMATH steps were plain
            # from none: a first share weighs no more than a later one. Kept unclipped, read clipped
            # at 0 (`aftermath_ms`), so that steps measured a little fast after drafts count too
            self.aftermath[self._last_kind] = 0.8 * self.aftermath.get(self._last_kind, 0.0) + 0.2 * share
        self._last_kind = ""

    def plain_ms(self) -> float:
        """A plain step's forward, as drafting is weighed against it: the session's one-token forward
        or, where less, the clean steps' (`clean_ms`: those AFTERMATH rounds or more after drafts),
        else the curve's. Drafting slows the steps beside it (the drafter's weights and a verify's
        wider forward push the target's out of the caches), so steps measured among drafts overstate
        what not drafting costs; what they add is charged to the drafts (`aftermath_ms`). The curve,
        measured at load, stands in only until clean steps are measured: in the decoding loop a
        step may cost more than it said, which would make drafts look dearer than they are."""
        reference = self.clean_ms if self.clean_ms is not None else self.curve.ms(1)
        return min(self.verify_ms(1), reference)

    def rate(self, acceptance: DepthAcceptance, k: int, draft_ms_per_token: float, width: int = 1) -> float:
        """Expected kept tokens per ms for a round of k >= 1 drafts and `width` candidates for the
        first: an alternative the target takes keeps one token more than a rejection does. A round
        whose first draft is refused (`refusal_share`) keeps one token for a draft and a plain step."""
        gained = acceptance.expected_tokens(k) + self.alternative_share(width)
        spent = k * draft_ms_per_token + self.verify_ms(k + width, width > 1) + self.charged_aftermath_ms("model")
        return self.refused(self.refusal_terms(draft_ms_per_token), gained, spent)

    def refusal_share(self) -> float:
        """How often a round that planned drafts had its first draft refused (decayed; prior: never)."""
        return self.refusals / (self.planned_drafts + PRIOR)

    def refusal_terms(self, draft_ms: float) -> tuple[float, float]:
        """What refused first drafts (`refusal_share`) make of any planned round's rate, read once
        for all the shapes a round weighs: the share r refused, and the ms spent besides (1 - r) of
        the round's own cost (the overhead and, r of the time, a draft and a plain step)."""
        r = self.refusal_share()
        return r, r * (self.overhead_ms + draft_ms + self.verify_ms(1)) + (1 - r) * self.drafted_overhead_ms

    @staticmethod
    def refused(terms: tuple[float, float], gained: float, spent: float) -> float:
        """Kept tokens per ms of a planned round that keeps `gained` for `spent` ms when its drafts
        are verified, and one token for a draft and a plain step when its first is refused
        (`terms`: `refusal_terms`)."""
        r, besides = terms
        return (r + (1 - r) * gained) / (besides + (1 - r) * spent)

    def alternative_share(self, width: int) -> float:
        """How often the target's first token was the drafter's 2nd..width-th likeliest (decayed)."""
        return sum(self.ranks[1:width]) / (self.ranked + PRIOR)

    def best_k(self) -> tuple[tuple[int, int], float]:
        """The (K, width) of the best `rate`, and that rate: (0, 1) is a plain step. Every shape's
        costs are read once (a round plans in a small share of a llama.cpp step)."""
        expected = self.drafts.expected(self.max_k)
        widths = range(1, self.max_width + 1)
        shares = {w: self.alternative_share(w) for w in widths}
        sizes = range(1, self.max_k + self.max_width + 1)
        chain = {n: self.verify_ms(n) for n in sizes}
        tree = {n: self.verify_ms(n, True) for n in sizes} if self.max_width > 1 else chain
        best, best_rate = (0, 1), expected[0] / (self.overhead_ms + self.plain_ms())
        terms = self.refusal_terms(self.draft_ms_per_token)
        for k in range(1, self.max_k + 1):
            spent = k * self.draft_ms_per_token + self.charged_aftermath_ms("model")
            for w in widths:
                gained, cost = expected[k] + shares[w], spent + (tree[k + w] if w > 1 else chain[k + 1])
                rate = self.refused(terms, gained, cost)
                if rate > best_rate:
                    best, best_rate = (k, w), rate
        return best, best_rate

    def copy_length(
        self, own: bool, match: int, available: int, beside_plan: bool = True, doubted: Sequence[bool] = ()
    ) -> int:
        """How many of a copy's `available` drafts to verify (0: none): the number whose expected
        kept tokens per ms is best, where it beats the round `plan` chose. `own`: copied from this
        request's own text; `match`: the length of the match the copy follows (0: unknown);
        `doubted`: which of its drafts were (`CopyAcceptance`). A copy is judged once it is found,
        so a steep cost curve (llama.cpp on a CPU, where a verify costs about a step per token)
        still verifies the long copies that pay and leaves the short ones. Without `beside_plan`
        (the drafter itself copies) the copy must beat a plain step instead.

        Tokens per ms stop a copy at the draft whose chance falls below the copy's own rate, above
        the planned round's: choosing instead the n that keeps the most tokens beyond what the
        planned round keeps in the same time (right where the estimates are) verified deeper, on
        drafts whose estimates ran high, and lost time."""
        best, best_rate = 0, self.planned_rate if beside_plan else 1.0 / (self.overhead_ms + self.plain_ms())
        longest = min(available, self.max_copy)
        expected = self.copies.expected(own, match, longest, doubted)
        after = self.charged_aftermath_ms("copy")
        for n in range(1, longest + 1):
            rate = expected[n] / (self.drafted_overhead_ms + self.verify_ms(n + 1) + after)
            if rate > best_rate:
                best, best_rate = n, rate
        return best

    def probe_due(self, plain_rate: float) -> bool:
        """Whether a plain round should draft one token instead, to measure the drafter again: every
        PROBE_EVERY rounds at most, and no sooner than the probe's expected loss (the time it takes
        beyond what plain steps take for the tokens it is expected to keep) is PROBE_BUDGET of the
        plain rounds' time since the last. A drafter that costs about what a target step costs (a
        feature head beside a quantized target on llama.cpp) is probed rarely, so it costs at most
        that share of the time when drafting does not pay."""
        if self.rounds_without_draft < PROBE_EVERY or not self.max_k:
            return False
        probe = 1.0 / self.rate(self.drafts, 1, self.draft_ms_per_token)  # ms per token kept by a probe
        loss_ms = (probe - 1.0 / plain_rate) * self.drafts.expected_tokens(1)
        return loss_ms <= PROBE_BUDGET * self.rounds_without_draft / plain_rate

    def plan(self) -> Shape:
        """The round's shape: the drafter's best (K, width), or a plain step; a copy where the text
        repeats, up to `max_copy` tokens, replaces it where `copy_length` finds the copy pays more."""
        (k, width), k_rate = self.best_k()
        self.planned_rate = k_rate
        if k == 0 and self.explored < EXPLORE and self.max_k:
            return Shape(self.max_copy, 1, 1)  # one draft, verified whatever its probability
        if k == 0:
            self.rounds_without_draft += 1
            if self.probe_due(k_rate):
                k = min(1, self.max_k)  # keep measuring the drafter, whose acceptance may have changed
                self.rounds_without_draft = 0
            return Shape(self.max_copy, k, width)
        self.rounds_without_draft = 0
        return self.with_floors(Shape(self.max_copy, k, width), k_rate)

    def with_floors(self, shape: Shape, rate: float) -> Shape:
        """`shape` with its chain allowed `DEEPER` more drafts, each drafted only where the drafter's
        own estimate that it passes with the chain before it, times what a kept token is worth at the
        planned rate (1 / rate ms), pays for the draft and the wider verify it adds (floors[d]: the
        least estimate for draft d + 1); the first draft (with a tree's alternatives) only where its
        probability is at least the share of a plain step that its verify adds (floors[0])."""
        if shape.k < 1 or rate <= 0:
            return shape
        k = min(self.max_k, shape.k + DEEPER)
        tree = shape.width > 1
        floors = tuple(
            (self.draft_ms_per_token + self.verify_ms(n + 1, tree) - self.verify_ms(n, tree)) * rate
            for n in range(shape.width, shape.width + k)  # n: the verify's tokens before draft d + 1
        )
        first = self.first_floor(shape.width) if self.explored >= EXPLORE else 0.0
        return Shape(shape.copy, k, shape.width, (first,) + floors[1:])

    def first_floor(self, width: int) -> float:
        """The least probability of a round's first draft (with a tree's alternatives, `width`
        candidates together) for it to be verified: what its verify adds to a plain step's, as a
        share of the step. It is drafted already when it is weighed, so its drafting cost is spent,
        and what it keeps must make up for that share."""
        step = self.overhead_ms + self.verify_ms(1)
        verified = self.drafted_overhead_ms + self.verify_ms(width + 1, width > 1)
        return max(0.0, (verified - step) / step)

    def record(
        self,
        shape: Shape,
        copied: bool,
        drafted: int,
        accepted: int,
        draft_ms: float,
        verify_ms: float,
        round_ms: float,
        rank: int | None = None,
        alternatives: int = 0,
        copy: tuple[bool, int, Sequence[bool]] | None = None,
    ) -> None:
        """What a round planned and what it measured; `rank`: where the target's first token stood
        among the drafter's first distribution (0: its top choice), for a round the drafter drafted;
        `copy`: for drafts copied from text, whether from this request's own, the match's length and
        which drafts were doubted."""
        label = round_label(drafted, copied, alternatives)
        self.chosen[label] = self.chosen.get(label, 0) + 1
        if rank is not None:
            self.ranks = [count * DECAY for count in self.ranks]
            self.ranked = self.ranked * DECAY + 1.0
            if rank < len(self.ranks):
                self.ranks[rank] += 1.0
        if copy is not None and drafted:
            own, match, doubted = copy
            self.copies.record(own, match, drafted, accepted, doubted)
        if drafted and not copied:
            self.drafts.record(drafted, accepted)
            self.explored += 1
        if shape.k and not copied:  # the drafter was asked: did its first draft pass its floor?
            self.planned_drafts = self.planned_drafts * DECAY + 1.0
            self.refusals = self.refusals * DECAY + (drafted == 0)
        if drafted + alternatives:
            self.owed = ("copy" if copied else "model", AFTERMATH)
            self.run_rounds += 1
        else:
            if self.owed[1]:
                self.owed = (self.owed[0], self.owed[1] - 1)
            if self.run_rounds:
                self.run_length = 0.8 * self.run_length + 0.2 * self.run_rounds
            self.run_rounds = 0
        if not self.adapt or sum(self.chosen.values()) <= SETTLE:  # rounds recorded: the first teach no costs
            return
        self._note_aftermath(drafted + alternatives, copied, verify_ms)
        n, tree = drafted + alternatives + 1, alternatives > 0
        # a size's first measurement also moves from the curve's estimate, not to it, and a verify held
        # up by other work (`HELD_UP`) counts as if it took twice the estimate: a size measured slow
        # once would otherwise stand until it is chosen again, and it is not chosen while it stands
        estimate = self.verify_ms(n, tree)
        held = min(verify_ms, HELD_UP * estimate)
        if tree:
            self.tree_scale = 0.8 * self.tree_scale + 0.2 * (held / self.verify_ms(n))
        else:  # the curve is a chain's
            self.scale = 0.8 * self.scale + 0.2 * (held / self.curve.ms(n))
        paced = self.curve.ms(n) * self.scale
        self.shapes[n, tree] = (0.7 * estimate + 0.3 * held) / paced
        other = max(0.0, round_ms - draft_ms - verify_ms)
        if drafted:
            self.drafted_overhead_ms = 0.8 * self.drafted_overhead_ms + 0.2 * other
        else:
            self.overhead_ms = 0.8 * self.overhead_ms + 0.2 * other
        if shape.k and not copied and draft_ms > 0.0:  # a refused first draft was drafted too
            per_token = draft_ms / max(drafted, 1)
            if self.draft_ms_per_token > 0.0:  # (an estimate of none is not held to)
                per_token = min(per_token, HELD_UP * self.draft_ms_per_token)
            self.draft_ms_per_token = 0.8 * self.draft_ms_per_token + 0.2 * per_token

    def carry_over(self, earlier: RoundPlanner) -> None:
        """Start from what an earlier session of the same drafter measured (acceptance by depth, the
        ranks of the target's tokens, the copies'), weighted as `CARRIED` rounds, so that a short
        session does not spend its first rounds learning what the drafter is like."""
        theirs = earlier.drafts
        scale = min(1.0, CARRIED / theirs.tried[0]) if theirs.tried and theirs.tried[0] else 0.0
        self.drafts.tried = [t * scale for t in theirs.tried]
        self.drafts.accepted = [a * scale for a in theirs.accepted]
        self.copies = earlier.copies.scaled(CARRIED)
        scale = min(1.0, CARRIED / earlier.ranked) if earlier.ranked else 0.0
        self.ranks = [r * scale for r in earlier.ranks]
        self.ranked = earlier.ranked * scale
        scale = min(1.0, CARRIED / earlier.planned_drafts) if earlier.planned_drafts else 0.0
        self.planned_drafts, self.refusals = earlier.planned_drafts * scale, earlier.refusals * scale
        self.aftermath, self.clean_ms = dict(earlier.aftermath), earlier.clean_ms  # the machine's, as measured
        self.run_length = earlier.run_length
        if theirs.tried:  # their verified drafts stand for this session's first (`EXPLORE`)
            self.explored = EXPLORE
