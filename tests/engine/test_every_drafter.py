"""Every drafter kind SpecDeck offers, on every torch path the built-in target's products can take,
writes the built-in target's plain greedy text: loaded as the window and `specdeck run` load them
(`load_pairs` from `PairSpec`s), under the constant and the auto schedule. The auto schedule plans
with a set cost curve of the target (measuring one takes seconds a path) and each drafter's
measured cost, which runs the drafter as the planner does."""

import pytest
from tiny import ON_CPU, PACKED_PATHS

from specdeck.engine import DecodeConfig, SummaryEvent, TokenEvent
from specdeck.engine.forward import row_kernel
from specdeck.engine.pair import DrafterKind, PairSpec
from specdeck.engine.planner.costs import CostCurve
from specdeck.engine.session import load_pairs, run_session

# How the target's products run (`specdeck.engine.forward.linear`, `specdeck.engine.forward.gguf_blocks`): the
# settings of SPECDECK_LINEAR and SPECDECK_GGUF_BLOCKS (None: unset), and what the path needs here
PATHS = {
    "dense": ({"SPECDECK_LINEAR": "dense", "SPECDECK_GGUF_BLOCKS": None}, None),
    "packed": ({"SPECDECK_LINEAR": "packed", "SPECDECK_GGUF_BLOCKS": None}, "packed"),
    "kernel": ({"SPECDECK_LINEAR": "kernel", "SPECDECK_GGUF_BLOCKS": "off"}, "kernel"),
    "blocks, float32 rows": ({"SPECDECK_LINEAR": "kernel", "SPECDECK_GGUF_BLOCKS": "float32"}, "kernel"),
    "blocks, int8 rows": ({"SPECDECK_LINEAR": "kernel", "SPECDECK_GGUF_BLOCKS": None}, "int8"),
}
# a list to repeat: prompt lookup and the suffix drafter find copies, the model drafters their own drafts
PROMPT = "Repeat this list exactly, then add one more: apples, pears, plums, cherries, grapes, lemons."
TOKENS = 12
# three layers of thirty: the layer-skip drafter's layers are set, not measured (it takes seconds)
LAYER_SKIP_LAYERS = 3


def _missing(needs: str | None) -> str | None:
    """Why a path cannot run on this machine, or None."""
    if needs in ("packed", "kernel") and needs not in PACKED_PATHS:
        return f"the {needs} product does not run here"
    if needs == "int8":
        return _missing("kernel") or row_kernel.int8_available()
    return None


@pytest.fixture(scope="module", params=list(PATHS))
def pairs(request):
    """The built-in target loaded on one path, with a pair for every drafter kind on it."""
    settings, needs = PATHS[request.param]
    if why := _missing(needs):
        pytest.skip(why)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in settings.items():
            if value is None:
                patch.delenv(name, raising=False)
            else:
                patch.setenv(name, value)
        base = PairSpec(device=ON_CPU.device, dtype=ON_CPU.dtype, backend="torch")
        specs = [
            base.with_drafter(kind, str(LAYER_SKIP_LAYERS) if kind is DrafterKind.LAYER_SKIP else None)
            for kind in DrafterKind
        ]
        loaded = dict(zip(DrafterKind, load_pairs(specs)))
        plain = _kept(run_session(loaded[DrafterKind.PROMPT_LOOKUP], PROMPT, _config("constant"), plain=True))
        yield loaded, plain


def _config(schedule: str) -> DecodeConfig:
    return DecodeConfig(k=2, schedule=schedule, max_new_tokens=TOKENS)


def _kept(events) -> tuple[list[int], SummaryEvent]:
    events = list(events)
    return [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept], events[-1]


@pytest.mark.parametrize("schedule", ["constant", "auto"])
@pytest.mark.parametrize("kind", list(DrafterKind), ids=str)
def test_every_drafter_writes_plain_text_on_every_path(pairs, kind, schedule, monkeypatch):
    """Greedy, the drafter's text is plain decoding's on the same path; with a fixed K its drafts
    were verified, a model drafter's own among them (not only prompt lookup's copies)."""
    monkeypatch.setattr(
        "specdeck.engine.loop.schedule.cost_curve",
        lambda model, cache_dir=None: CostCurve((1, 2, 4, 8, 16), (10.0, 10.2, 10.5, 11.0, 12.0)),
    )
    loaded, (plain, _) = pairs
    kept, summary = _kept(run_session(loaded[kind], PROMPT, _config(schedule)))
    assert kept == plain
    if schedule == "constant":
        assert summary.drafted > 0
        if not kind.copies_text:
            own = summary.drafted - summary.copied_drafted
            assert own > 0, f"the {kind.label} drafter drafted nothing of its own"
