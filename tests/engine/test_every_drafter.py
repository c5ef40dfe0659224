"""Every registered drafter kind (`specdeck.engine.drafting.registry`), on every path it claims, writes the
plain greedy text of the same target on that path: the built-in target on each torch path its
products can take, on llama.cpp, served by llama-cpp-python's server, and on a GPU (skipped where
one is missing), loaded as the window and `specdeck run` load them (`load_pairs` from
`PairSpec`s), under the constant and the auto schedule. Every path a kind does not claim is refused
with one line before the session. The auto schedule plans with a set cost curve of the target
(measuring one takes seconds a path) and each drafter's measured cost, which runs the drafter as
the planner does."""

from dataclasses import dataclass, field

import pytest
import torch
from serving import NOT_SERVED, SERVED, llama_cpp_server
from tiny import ON_CPU, PACKED_PATHS

from specdeck.engine import DecodeConfig, SpecDeckError, SummaryEvent, TokenEvent
from specdeck.engine.drafting.registry import DrafterKind, TargetPath, target_path
from specdeck.engine.forward import row_kernel
from specdeck.engine.forward.llamacpp_backend import library
from specdeck.engine.loading.registry import BUILTIN_MODELS, DEFAULT_DRAFT, DEFAULT_TARGET
from specdeck.engine.pair import PairSpec
from specdeck.engine.session import load_pair, load_pairs, run_session

# a list to repeat: prompt lookup and the suffix drafter find copies, the model drafters their own drafts
PROMPT = "Repeat this list exactly, then add one more: apples, pears, plums, cherries, grapes, lemons."
TOKENS = 12


@dataclass(frozen=True)
class PathCase:
    """One way the built-in target runs: what it is to the registry, the settings of
    SPECDECK_LINEAR and SPECDECK_GGUF_BLOCKS (None: unset) for a torch path, and what it needs here."""

    path: TargetPath
    settings: dict[str, str | None] = field(default_factory=dict)
    needs: str | None = None
    spec: PairSpec = PairSpec(device=ON_CPU.device, dtype=ON_CPU.dtype, backend="torch")


PATHS = {
    "dense": PathCase(TargetPath.TORCH, {"SPECDECK_LINEAR": "dense", "SPECDECK_GGUF_BLOCKS": None}),
    "packed": PathCase(TargetPath.TORCH, {"SPECDECK_LINEAR": "packed", "SPECDECK_GGUF_BLOCKS": None}, "packed"),
    "kernel": PathCase(TargetPath.KERNEL, {"SPECDECK_LINEAR": "kernel", "SPECDECK_GGUF_BLOCKS": "off"}, "kernel"),
    "blocks, float32 rows": PathCase(
        TargetPath.KERNEL, {"SPECDECK_LINEAR": "kernel", "SPECDECK_GGUF_BLOCKS": "float32"}, "kernel"
    ),
    "blocks, int8 rows": PathCase(
        TargetPath.KERNEL, {"SPECDECK_LINEAR": "kernel", "SPECDECK_GGUF_BLOCKS": None}, "int8"
    ),
    "llama.cpp": PathCase(TargetPath.LLAMA_CPP, needs="llama.cpp", spec=PairSpec(backend="llama.cpp")),
    # the address is the test server's once it runs (nothing answers at port 9, for refusals)
    "served": PathCase(
        TargetPath.SERVED,
        needs="server",
        spec=PairSpec("http://127.0.0.1:9/v1", target_model="target"),
    ),
    "gpu": PathCase(TargetPath.GPU, needs="gpu", spec=PairSpec(device="cuda", dtype="float32", backend="torch")),
}
# three layers of thirty: the layer-skip drafter's layers are set, not measured (it takes seconds)
LAYER_SKIP_LAYERS = 3


def _draft(kind: DrafterKind, path: PathCase) -> str | None:
    """What --draft names for `kind` on `path`: its layers, the built-in model it drafts with, or,
    for a served target (whose tokenizer SpecDeck's own models share but which they do not attach
    to), the built-in draft model where the kind takes one."""
    if kind.takes_layers:
        return str(LAYER_SKIP_LAYERS)
    if path.path is TargetPath.SERVED:
        return DEFAULT_DRAFT if kind.drafts_as(DEFAULT_DRAFT) is DrafterKind.DRAFT_MODEL else None
    return kind.builtin_model(DEFAULT_TARGET)


def _claims(kind: DrafterKind, path: PathCase) -> bool:
    return path.path in kind.paths(_draft(kind, path))


REFUSED = [(name, kind) for name, path in PATHS.items() for kind in DrafterKind if not _claims(kind, path)]


def _missing(needs: str | None) -> str | None:
    """Why a path cannot run on this machine, or None."""
    if needs in ("packed", "kernel") and needs not in PACKED_PATHS:
        return f"the {needs} product does not run here"
    if needs == "int8":
        return _missing("kernel") or row_kernel.int8_available()
    if needs == "llama.cpp" and library() is None:
        return "llama-cpp-python is not installed"
    if needs == "server" and not SERVED:
        return NOT_SERVED
    if needs == "gpu" and not torch.cuda.is_available():
        return f"needs a CUDA GPU: this torch ({torch.__version__}) sees none"
    return None


@pytest.fixture(
    scope="module", params=[pytest.param(name, marks=pytest.mark.cuda) if name == "gpu" else name for name in PATHS]
)
def pairs(request, builtin_conversion):
    """The built-in target loaded on one path, with a pair for every drafter kind that claims it,
    and plain decoding's kept tokens there (the float32 paths load the run's one conversion)."""
    path = PATHS[request.param]
    if why := _missing(path.needs):
        pytest.skip(why)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in path.settings.items():
            if value is None:
                patch.delenv(name, raising=False)
            else:
                patch.setenv(name, value)
        if path.path is TargetPath.SERVED:
            with llama_cpp_server(BUILTIN_MODELS[DEFAULT_TARGET].path()) as url:
                yield _load(PairSpec(url, target_model="target"), path)
        else:
            yield _load(path.spec, path)


def _load(base: PairSpec, path: PathCase) -> tuple[dict, list[int]]:
    kinds = [kind for kind in DrafterKind if _claims(kind, path)]
    loaded = dict(zip(kinds, load_pairs([base.with_drafter(kind, _draft(kind, path)) for kind in kinds])))
    target = next(iter(loaded.values())).target
    assert target_path(target) is path.path, f"the target runs {target_path(target).where}, not {path.path.where}"
    first = next(iter(loaded.values()))
    plain, _ = _kept(run_session(first, PROMPT, _config("constant"), plain=True))
    return loaded, plain


def _config(schedule: str) -> DecodeConfig:
    return DecodeConfig(k=2, schedule=schedule, max_new_tokens=TOKENS)


def _kept(events) -> tuple[list[int], SummaryEvent]:
    events = list(events)
    return [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept], events[-1]


@pytest.mark.parametrize("schedule", ["constant", "auto"])
@pytest.mark.parametrize("kind", list(DrafterKind), ids=str)
@pytest.mark.usefixtures("set_cost_curve")
def test_every_drafter_writes_plain_text_on_every_path_it_claims(pairs, kind, schedule):
    """Greedy, the drafter's text is plain decoding's on the same path; with a fixed K its drafts
    were verified, a model drafter's own among them (not only its copier's)."""
    loaded, plain = pairs
    if kind not in loaded:
        pytest.skip(f"the {kind} drafter does not claim this path (its refusal is tested below)")
    kept, summary = _kept(run_session(loaded[kind], PROMPT, _config(schedule)))
    assert kept == plain
    if schedule == "constant":
        assert summary.drafted > 0
        if not kind.copies_text:
            own = summary.drafted - summary.copied_drafted
            assert own > 0, f"the {kind.label} drafter drafted nothing of its own"


@pytest.mark.parametrize("name, kind", REFUSED, ids=str)
def test_every_path_a_drafter_does_not_claim_is_refused_in_one_line(name, kind, monkeypatch):
    """Asked for a path it does not claim, the pair is refused before the session (and, where the
    path is known before the target loads, before anything loads), in one line that names the
    drafter, the path and the drafters that run there."""
    path = PATHS[name]
    if path.path not in (TargetPath.SERVED, TargetPath.LLAMA_CPP):
        if why := _missing(path.needs):
            pytest.skip(why)
    else:
        monkeypatch.setattr("specdeck.engine.session._load_target", lambda *args: pytest.fail("the target loaded"))
    with pytest.raises(SpecDeckError) as refused:
        load_pair(path.spec.with_drafter(kind, _draft(kind, path)))
    message = str(refused.value)
    assert "\n" not in message and f"The {kind} drafter" in message and path.path.where in message
    assert any(str(other) in message.split("Choose")[-1] for other in DrafterKind if _claims(other, path))
