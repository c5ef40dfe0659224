"""The verdict of a round: which tokens it keeps, which rows the cache keeps, and what became of
every draft it did not keep, decided once by `verify` for the transcript to read."""

import torch

from specdeck.engine.config import DecodeConfig
from specdeck.engine.drafting.proposals import one_hot
from specdeck.engine.events import TokenState
from specdeck.engine.loop.draft_tree import DraftTree
from specdeck.engine.loop.verification import verify

WIDTH = 8
GREEDY = DecodeConfig()


def _logits(*best: int) -> torch.Tensor:
    """One row per forward input, each with its argmax at the given token."""
    rows = torch.zeros(len(best), WIDTH)
    rows[torch.arange(len(best)), torch.tensor(best)] = 5.0
    return rows


def _states(verdict) -> dict[int, TokenState]:
    return {r.token: r.state for r in verdict.refused}


def test_a_refused_chain_keeps_its_passed_drafts_then_the_target_s_token():
    """Drafts 3, 4, 5 where the target takes 3 then 6: keep 3 and the correction 6; the cache keeps
    the newest kept token's row and the passed draft's; 4 rejected, 5 discarded unjudged."""
    draft = DraftTree(one_hot([3, 4, 5], WIDTH, torch.device("cpu")))
    verdict = verify(draft, _logits(3, 6, 1, 2), GREEDY, None)
    assert verdict.kept == [3, 6] and verdict.accepted == verdict.chain_accepted == 1
    assert verdict.path == [0, 1] and verdict.last is TokenState.RESAMPLED
    assert _states(verdict) == {4: TokenState.REJECTED, 5: TokenState.DISCARDED}


def test_a_chain_that_passes_whole_earns_the_bonus():
    """Every draft the target's argmax: all kept, then the bonus from the row after the last."""
    draft = DraftTree(one_hot([3, 4], WIDTH, torch.device("cpu")))
    verdict = verify(draft, _logits(3, 4, 7), GREEDY, None)
    assert verdict.kept == [3, 4, 7] and verdict.path == [0, 1, 2]
    assert verdict.last is TokenState.BONUS and not verdict.refused


def test_a_served_continuation_is_kept_whole_past_a_refused_draft():
    """Rows along a server's own continuation 3, 6, 1, 2, 7 against drafts 3, 4, 5: draft 3 agreed,
    4 rejected, 5 discarded, and every token of the continuation kept, the ones past the target's own
    with no q (no draft judged them)."""
    draft = DraftTree(one_hot([3, 4, 5], WIDTH, torch.device("cpu")))
    verdict = verify(draft, _logits(3, 6, 1, 2, 7), GREEDY, None, continuation=True)
    assert verdict.kept == [3, 6, 1, 2, 7] and verdict.accepted == 1 and verdict.token == 6
    assert verdict.last is TokenState.RESAMPLED and verdict.q[2:] == [None, None, None]
    assert _states(verdict) == {4: TokenState.REJECTED, 5: TokenState.DISCARDED}


def test_an_accepted_alternative_keeps_its_own_row_and_its_bonus():
    """A tree of chain 3, 4 and alternatives 5, 6 where the target takes 6: keep 6 and the target's
    token on 6's own row; the cache keeps rows 0 and 6's; the chain and alternative 5 are refused."""
    draft = DraftTree(one_hot([3, 4], WIDTH, torch.device("cpu")), alternatives=[5, 6])
    #               newest, 3, 4, 5, 6 (rows in `DraftTree.forward_inputs` order)
    verdict = verify(draft, _logits(6, 1, 1, 1, 2), GREEDY, None)
    assert verdict.kept == [6, 2] and verdict.accepted == 1 and verdict.chain_accepted == 0
    assert verdict.path == [0, 4] and verdict.last is TokenState.BONUS
    assert _states(verdict) == {3: TokenState.REJECTED, 4: TokenState.DISCARDED, 5: TokenState.REJECTED}
    assert verdict.q == [0.0, None]  # a copy's q is one-hot on its first draft, not on the alternative


def test_sampled_alternatives_stay_untried_where_the_first_draft_passes():
    """Sampled, a first draft the target is sure of passes: its alternatives were never judged,
    discarded, with no chance given."""
    draft = DraftTree(one_hot([3], WIDTH, torch.device("cpu")), alternatives=[5, 6])
    logits = torch.full((4, WIDTH), -30.0)
    logits[0, 3] = logits[1, 2] = 30.0
    verdict = verify(draft, logits, DecodeConfig(temperature=1.0), torch.Generator().manual_seed(0))
    assert verdict.kept == [3, 2] and verdict.chain_accepted == 1
    assert all(r.state is TokenState.DISCARDED and r.chance is None for r in verdict.refused)
    assert [r.token for r in verdict.refused] == [5, 6]
