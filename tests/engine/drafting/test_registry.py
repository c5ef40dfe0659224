"""The drafter registry: every kind says why it leaves a path out, and a kind that drafts with a
draft model or a feature head runs where the model it is given runs (the runs themselves are
`tests/engine/test_every_drafter.py`)."""

import pytest

from specdeck.engine.drafting.registry import DrafterKind, TargetPath
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.loading.registry import DEFAULT_DRAFT, DEFAULT_HEAD
from specdeck.engine.pair import PairSpec

SERVER = "http://127.0.0.1:9/v1"  # nothing answers there: a refusal comes before any request


@pytest.mark.parametrize("kind", list(DrafterKind), ids=str)
def test_every_path_left_out_is_refused_with_a_reason(kind):
    """Each path a kind leaves out gets one sentence with its reason filled in and a kind that runs there."""
    for path in set(TargetPath) - kind.paths(kind.record.builtin):
        message = kind.refusal(path, kind.record.builtin)
        assert message and ": ." not in message and "{" not in message and "\n" not in message, message
        assert any(f"{other}" in message.split("Choose")[-1] for other in DrafterKind if path in other.paths())


def test_the_hybrid_runs_where_its_model_runs():
    """The hybrid with a draft model runs on a server; with a feature head it is refused there,
    before anything loads, as the feature head's own reason says."""
    assert TargetPath.SERVED in DrafterKind.HYBRID.paths(DEFAULT_DRAFT)
    assert TargetPath.SERVED not in DrafterKind.HYBRID.paths(DEFAULT_HEAD)
    assert PairSpec(SERVER, DEFAULT_DRAFT, DrafterKind.HYBRID, target_model="m").resolved().draft == DEFAULT_DRAFT
    with pytest.raises(SpecDeckError, match="hybrid drafter with a feature head does not run on a server: .*hidden"):
        PairSpec(SERVER, DEFAULT_HEAD, DrafterKind.HYBRID, target_model="m").resolved()


def test_every_kind_has_its_record_and_its_code():
    """Each kind is registered in both tables, what it is (`specdeck.engine.drafting.kinds.RECORDS`)
    and how it loads and drafts (`specdeck.engine.drafting.registry.REGISTRY`): none is offered that
    no session could make."""
    from specdeck.engine.drafting.kinds import RECORDS
    from specdeck.engine.drafting.registry import REGISTRY

    assert set(RECORDS) == set(DrafterKind) == set(REGISTRY)
