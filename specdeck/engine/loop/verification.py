"""The acceptance step of a round (`verify`): the target's logits judge the drafts, and the
`Verdict` says, once, what became of each: the kept tokens (accepted drafts, then the target's own
token, resampled or a bonus), the refused drafts (rejected, or discarded unjudged) and what the rule
read for each (p, q, a sampled tree's chances). The transcript reads it to label tokens; the cache
keeps `Verdict.path`.

Leviathan et al. 2023, algorithm 1; Chen et al. 2023: accept d_i with probability
min(1, p_i(d_i) / q_i(d_i)) in order until one is refused; replace the refused one by a draw from
norm(max(0, p_i - q_i)); when all pass, draw a bonus from p after the last draft. Greedy is the
temperature-0 case. Trees: SpecInfer (Miao et al. 2024) and EAGLE (Li et al. 2024), below.

A served target may answer with its own greedy continuation instead of scoring the drafts
(`specdeck.engine.remote.remote_continuation`): row r is then the target's distribution after the
continuation's first r tokens, and every row's argmax is the target's own greedy token after the
ones before it, so the verdict keeps all of them, the drafts judged as usual against the rows up to
the first that parts from the continuation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from specdeck.engine.config import DecodeConfig
from specdeck.engine.drafting.proposals import DraftPiece
from specdeck.engine.events import TokenState
from specdeck.engine.loop.draft_tree import DraftTree
from specdeck.engine.sampling import alternative_chances, argmaxes, logits_to_probs, residual, sample


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
    """What the target made of a round's drafts: the kept tokens (the first `accepted` of them
    drafts, the last the target's own, in state `last`), each one's p and q (None where nothing
    drafted it), and the refused drafts, each shown before the kept token at its position or, past
    the kept drafts, before kept token `chain_accepted`. `path`: the forward's inputs whose rows
    decided a kept token (the newest kept token's, then the accepted drafts'), which the cache keeps.
    A draft with a tokenizer of its own (`specdeck.engine.drafting.cross_vocab`) adds what it wrote for each
    kept draft; a sampled tree's accepted alternative, the chance it had (`Refused.chance`).
    Kept tokens after the target's own (`kept[accepted + 1:]`, a served target's continuation) are
    the target's greedy text too, no draft judged: shown plain."""

    kept: list[int]
    accepted: int
    chain_accepted: int  # the chain's drafts that passed (0 where an alternative beside it was kept)
    path: list[int]
    last: TokenState
    p: list[float]
    q: list[float | None]
    refused: list[Refused]
    pieces: list[DraftPiece | None] | None = None
    first_chance: float | None = None  # a sampled tree's accepted alternative (kept[0]): its chance

    @property
    def token(self) -> int:
        """The target's own token: the correction, the bonus, or a plain step's token."""
        return self.kept[self.accepted]


def verify(
    draft: DraftTree,
    logits: torch.Tensor,
    config: DecodeConfig,
    generator: torch.Generator | None,
    continuation: bool = False,
) -> Verdict:
    """Judge the round's drafts against the target's logits, one row per forward input
    (`DraftTree.forward_inputs`): the chain's n drafts by their rows 0..n, and where the first draft
    is refused, the tree's alternatives to it (other first tokens, none of them the first draft nor
    each other), whose own row gives the bonus after an accepted one.

    Sampled alternatives are the drafter's likeliest tokens, fixed candidates rather than draws from
    q, so each is tried in turn against the residual r = norm(max(0, p - q)) left by the refused
    first draft (multi-candidate rejection sampling, SpecInfer; EAGLE): accept a with probability
    r(a); on refusal set r(a) = 0 and renormalise; after the last, draw from what is left. This keeps
    the first token ~ p exactly. The first draft alone gives P(x) = min(p(x), q(x)) and is refused
    with probability sum max(0, p - q), after which the token must follow r. One candidate a judged
    against any distribution r gives P(a) = r(a) and, for x != a, (1 - r(a)) r(x) / (1 - r(a)) =
    r(x): the output follows r again, and by induction over the candidates so does the whole
    sequence. An accepted alternative's row then gives the bonus, a draw from p given it: the
    target's distribution after the kept tokens and a.

    With `continuation` (greedy only), `logits` are a served target's rows along its own greedy
    continuation, possibly more than the drafts + 1: the drafts are judged as above, then every row's
    argmax is kept (module docstring), so a round keeps the whole continuation whatever the drafts did.
    """
    n = len(draft.tokens)
    chain = logits[: n + 1]
    p = logits_to_probs(chain, config)
    proposal, alternatives = draft.proposal, draft.alternatives
    chances: list[float] = []  # each alternative's chance against the residual (sampled, first draft refused)
    taken: int | None = None  # the alternative accepted, by its index
    if config.greedy:  # accept while the draft is the target's argmax; the argmax then corrects, or is the bonus
        best = argmaxes(chain)
        m = 0
        while m < n and proposal.tokens[m] == best[m]:
            m += 1
        token = best[m]
        if m == 0 and token in alternatives:
            taken = alternatives.index(token)
    else:
        drafts = torch.tensor(proposal.tokens, device=p.device, dtype=torch.long)
        rows = torch.arange(n, device=p.device)
        # target prob p, draft prob q: accept with min(1, p/q), i.e. refuse where r q > p for r ~ U(0, 1)
        r = torch.rand(n, generator=generator, device=p.device)
        rejected = (r * proposal.q[rows, drafts] > p[rows, drafts]).nonzero()
        m = int(rejected[0]) if rejected.numel() else n
        if m == n:  # bonus: p after the last draft is the target's distribution given every kept token
            token = int(sample(p[n], generator, greedy=False))
        else:  # correct: p where q fell short, norm(max(0, p - q)); with the accepts, exactly p
            left = residual(p[m], proposal.q[m])
            if m == 0 and alternatives:  # a tree: each alternative in turn against the residual, refused ones zeroed
                odds, left = alternative_chances(left, list(alternatives))
                chances = odds.tolist()
                passed = (torch.rand(len(alternatives), generator=generator, device=p.device) < odds).nonzero()
                taken = int(passed[0]) if passed.numel() else None
            token = alternatives[taken] if taken is not None else int(sample(left, generator, greedy=False))
    if taken is None:
        verdict = _chain_verdict(draft, m, token, p, config, chances)
        return _continued(verdict, logits) if continuation else verdict
    # a tree: an alternative to the first draft was accepted; its own row gives the bonus, the
    # target's token after it (greedy: its argmax; sampled: a draw from p there)
    row = n + 1 + taken
    p_after = logits_to_probs(logits[row], config)
    bonus = argmaxes(logits[row].unsqueeze(0))[0] if config.greedy else int(sample(p_after, generator, greedy=False))
    return _tree_verdict(draft, taken, bonus, float(p[0, token]), float(p_after[bonus]), p, config, chances)


def _chain_verdict(
    draft: DraftTree, m: int, token: int, p: torch.Tensor, config: DecodeConfig, chances: list[float]
) -> Verdict:
    """The verdict where the chain's first m drafts passed and `token` follows them: the cache keeps
    the newest kept token's row and theirs."""
    n, proposal = len(draft.tokens), draft.proposal
    kept = draft.tokens[:m] + [token]
    # p of every draft in its row, then of the target's token in row m: one read from the device a
    # round (each read waits for the GPU), the kept drafts' and the refused ones' alike
    index = torch.tensor([[*range(n), m], [*draft.tokens, token]], device=p.device)
    p_read = p[index[0], index[1]].tolist()
    p_kept = p_read[:m] + [p_read[n]]
    last = TokenState.PLAIN if not n else (TokenState.BONUS if m == n else TokenState.RESAMPLED)
    q_drafts = proposal.q_of(draft.tokens)  # each draft's q in its row: the kept ones' and the refused ones'
    # a resampled token has the refused draft's row of q
    q_kept: list[float | None] = [
        *q_drafts[:m],
        *(proposal.q_of([token], row=m) if last is TokenState.RESAMPLED else []),
    ]
    pieces = proposal.pieces
    refused = _refused_drafts(draft.tokens[m:], p_read[m:n], q_drafts[m:], m + 1, pieces)
    if draft.alternatives and (m == 0 or not config.greedy):
        # greedy: the argmax refused them all with the first draft; sampled: tried in turn after its
        # refusal, all refused (m = 0), or never tried (m > 0)
        refused += _refused_alternatives(draft, p[0], chances, tried=len(draft.alternatives) if m == 0 else 0)
    kept_pieces = [pieces[i] if i < m else None for i in range(len(kept))] if pieces else None
    q_kept += [None] * (len(kept) - len(q_kept))
    return Verdict(kept, m, m, list(range(m + 1)), last, p_kept, q_kept, refused, kept_pieces)


def _continued(verdict: Verdict, logits: torch.Tensor) -> Verdict:
    """`verdict` with the rest of a served target's greedy continuation kept after its own token:
    row r's argmax follows the continuation's first r tokens, which the verdict's kept tokens are."""
    start = len(verdict.kept)
    if logits.shape[0] == start:
        return verdict
    rest = argmaxes(logits[start:])
    p_rest = torch.softmax(logits[start:].float(), dim=-1)[torch.arange(len(rest)), torch.tensor(rest)].tolist()
    pieces = verdict.pieces + [None] * len(rest) if verdict.pieces is not None else None
    return replace(
        verdict, kept=verdict.kept + rest, p=verdict.p + p_rest, q=verdict.q + [None] * len(rest), pieces=pieces
    )


def _tree_verdict(
    draft: DraftTree,
    taken: int,
    bonus: int,
    p_taken: float,
    p_bonus: float,
    p: torch.Tensor,
    config: DecodeConfig,
    chances: list[float],
) -> Verdict:
    """The verdict where the chain's first draft was refused and alternative `taken` accepted in its
    place, `bonus` after it: the cache keeps the newest kept token's row and the alternative's."""
    n, proposal = len(draft.tokens), draft.proposal
    alternative = draft.alternatives[taken]
    p_drafts = p[torch.arange(n, device=p.device), torch.tensor(draft.tokens, device=p.device)].tolist()
    refused = _refused_drafts(draft.tokens, p_drafts, proposal.q_of(draft.tokens), 1, proposal.pieces)
    tried = len(draft.alternatives) if config.greedy else taken  # greedy: the argmax refused all the others
    refused += _refused_alternatives(draft, p[0], chances, tried, kept=alternative)
    q_kept = [proposal.q_of([alternative], row=0)[0], None]
    pieces: list[DraftPiece | None] | None = [None, None] if proposal.pieces else None
    first_chance = chances[taken] if chances else None
    path = [0, n + 1 + taken]
    return Verdict(
        [alternative, bonus], 1, 0, path, TokenState.BONUS, [p_taken, p_bonus], q_kept, refused, pieces, first_chance
    )


def _refused_drafts(
    tokens: list[int], p: list[float], q: list[float], depth: int, pieces: list[DraftPiece] | None = None
) -> list[Refused]:
    """A chain's refused drafts from `depth` on, with their p and q: the first rejected, those
    after it discarded, never judged."""
    if not tokens:
        return []
    states = [TokenState.REJECTED] + [TokenState.DISCARDED] * (len(tokens) - 1)
    figures = zip(tokens, p, q, states)
    return [
        Refused(t, pv, qv, depth + i, state, pieces[depth + i - 1] if pieces else None)
        for i, (t, pv, qv, state) in enumerate(figures)
    ]


def _refused_alternatives(
    draft: DraftTree, p: torch.Tensor, chances: list[float], tried: int, kept: int | None = None
) -> list[Refused]:
    """A tree's alternatives not kept (all but `kept`), at depth 1 with the first row's p and q: the
    first `tried` judged and refused, rejected (sampled: with the chance each had against the
    residual), the rest never judged, discarded."""
    alternatives = draft.alternatives
    values = zip(alternatives, p[alternatives].tolist(), draft.proposal.q_of(alternatives, row=0))
    return [
        Refused(t, pv, qv, 1, TokenState.REJECTED, chance=chances[i] if chances else None)
        if i < tried
        else Refused(t, pv, qv, 1, TokenState.DISCARDED)
        for i, (t, pv, qv) in enumerate(values)
        if t != kept
    ]
