"""How each drafter kind loads and drafts (`REGISTRY`): what it loads beside the target
(`DrafterCode.load`) and how a session's drafter is made on a loaded pair (`DrafterCode.make`).
What each kind is before anything loads, its name, options and paths, is its `DrafterRecord` in
`specdeck.engine.drafting.kinds`.

The pair (`specdeck.engine.pair`) and the session (`specdeck.engine.session`) read these tables
instead of branching on the kind, as vLLM's engine asks each proposer what it supports: a new
drafter is its module, one `DrafterRecord` in `kinds`, one `DrafterCode` here and its tests
(`tests/engine/test_every_drafter.py` runs every record on every path it claims, and checks that
every other path is refused).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from specdeck.engine.drafting.cross_vocab import CrossVocabularyDrafter
from specdeck.engine.drafting.draft_model import DraftModelDrafter
from specdeck.engine.drafting.drafters import Drafter, PromptLookupDrafter
from specdeck.engine.drafting.head_drafter import FeatureHeadDrafter
from specdeck.engine.drafting.heads import LoadedHead, load_feature_head
from specdeck.engine.drafting.kinds import DrafterKind, TargetPath
from specdeck.engine.drafting.layer_skip import LayerChoice, LayerSkipDrafter, choose_layers
from specdeck.engine.drafting.suffix import SuffixIndex
from specdeck.engine.drafting.suffix_drafting import HYBRID_MIN_SCORE, SuffixDrafter
from specdeck.engine.drafting.vocabulary import VocabularyMatch, match_vocabularies
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward.lean_weights import weights_of
from specdeck.engine.forward.llama_families import supports
from specdeck.engine.forward.llamacpp_backend import LlamaCppModel
from specdeck.engine.loading.models import LoadedModel, LoadOptions, Progress, load_model
from specdeck.engine.loading.registry import gguf_file, names_head
from specdeck.engine.remote.remote_target import RemoteTarget

if TYPE_CHECKING:
    from specdeck.engine.pair import ModelPair

__all__ = ["REGISTRY", "DrafterCode", "DrafterKind", "DrafterModels", "TargetPath", "load_drafter", "make_drafter"]


def target_path(target: LoadedModel | RemoteTarget) -> TargetPath:
    """The path a loaded (or served) target runs on; a torch target's products are laid out here
    if they were not yet (`weights_of`, which the session's load does anyway)."""
    if isinstance(target, RemoteTarget):
        return TargetPath.SERVED
    if isinstance(target.model, LlamaCppModel):
        return TargetPath.LLAMA_CPP
    if target.device.type != "cpu":
        return TargetPath.GPU
    if supports(target.model) and weights_of(target.model).products.path == "kernel":
        return TargetPath.KERNEL
    return TargetPath.TORCH


@dataclass(frozen=True)
class DrafterModels:
    """What a drafter kind loads beside the target (`DrafterCode.load`)."""

    draft: LoadedModel | None = None
    head: LoadedHead | None = None
    vocabulary: VocabularyMatch | None = None  # how the draft's vocabulary relates to the target's
    layer_choice: LayerChoice | None = None  # the layer-skip drafter's layers


# loads what a kind drafts with beside `target`: (target, --draft, --draft-layers, options, progress)
Loader = Callable[[LoadedModel | RemoteTarget, str | None, int | None, LoadOptions, Progress | None], DrafterModels]


def _in_process(target: LoadedModel | RemoteTarget) -> LoadedModel:
    """The target where a drafter reads it in this process; a served one was refused by its path."""
    if isinstance(target, RemoteTarget):
        raise SpecDeckError(f"{target.describe()} is served, not loaded here: load the model itself with --target.")
    return target


def _load_nothing(target, draft, layers, options, progress) -> DrafterModels:
    return DrafterModels()


def _load_layers(target, draft, layers, options, progress) -> DrafterModels:
    return DrafterModels(layer_choice=choose_layers(_in_process(target), layers, progress))


def _load_draft(target, draft, layers, options: LoadOptions, progress) -> DrafterModels:
    """A draft model, and how its vocabulary relates to the target's: one with a tokenizer of its
    own drafts across them. A draft that is no GGUF file runs on torch, whatever runs the target."""
    if names_head(draft):
        raise SpecDeckError(f"{draft} is a feature head, not a draft model: choose the feature-head drafter.")
    if gguf_file(draft) is None:
        options = replace(options, backend="torch")
    model = load_model(draft, options, progress)
    vocabulary = match_vocabularies(target, model)
    if progress and not vocabulary.same:
        progress(f"{model.name} and {target.name}: {vocabulary.describe()}")
    return DrafterModels(draft=model, vocabulary=vocabulary)


def _load_head(target, draft, layers, options, progress) -> DrafterModels:
    return DrafterModels(head=load_feature_head(draft, _in_process(target), progress))


def _load_draft_or_head(target, draft, layers, options, progress) -> DrafterModels:
    load = _load_head if names_head(draft) else _load_draft
    return load(target, draft, layers, options, progress)


def _copies(pair: ModelPair, history: SuffixIndex | None, min_score: float = 0.0) -> SuffixDrafter:
    """A suffix drafter on the pair's history, past sessions and the target's own texts; given
    `history`, on that and the target's texts, leaving it as it is."""
    mine = history is None
    return SuffixDrafter(
        pair.history if mine else history,
        pair.past if mine else None,
        records=mine,
        texts=pair.past.target_texts() if pair.past is not None else None,
        min_score=min_score,
        device=pair.target.device,
    )


def _model_drafter(pair: ModelPair, history: SuffixIndex | None = None) -> Drafter:
    """A drafter on the pair's draft model (across vocabularies where its own differs) or feature
    head, whichever the pair loaded."""
    draft, vocabulary = pair.draft_model, pair.vocabulary
    if draft is not None and vocabulary is not None and not vocabulary.same:
        return CrossVocabularyDrafter(draft.model, vocabulary, name=draft.name, output_ids=draft.output_ids)
    if draft is not None:
        return DraftModelDrafter(draft.model, name=draft.name, output_ids=draft.output_ids)
    if pair.head is not None:
        return FeatureHeadDrafter(
            pair.head.head, pair.local_target.model, name=pair.head.name, output_ids=pair.head.output_ids
        )
    raise SpecDeckError("This drafter needs a draft model or a feature head, and none is loaded: load the pair again.")


def _hybrid(pair: ModelPair, history: SuffixIndex | None = None) -> Drafter:
    return _model_drafter(pair, history).copying_first(_copies(pair, history, HYBRID_MIN_SCORE))


def _layer_skip(pair: ModelPair, history: SuffixIndex | None = None) -> Drafter:
    if pair.layer_choice is None:
        raise SpecDeckError("The layer-skip drafter's layers were not chosen: load the pair with load_pair.")
    return LayerSkipDrafter(pair.local_target.torch_model, pair.layer_choice)


@dataclass(frozen=True)
class DrafterCode:
    """How one drafter kind loads and drafts."""

    make: Callable[[ModelPair, SuffixIndex | None], Drafter]  # a drafter for one session on a loaded pair
    load: Loader = _load_nothing


REGISTRY: dict[DrafterKind, DrafterCode] = {
    DrafterKind.DRAFT_MODEL: DrafterCode(make=_model_drafter, load=_load_draft),
    DrafterKind.FEATURE_HEAD: DrafterCode(make=_model_drafter, load=_load_head),
    DrafterKind.PROMPT_LOOKUP: DrafterCode(make=lambda pair, history: PromptLookupDrafter(device=pair.target.device)),
    DrafterKind.SUFFIX: DrafterCode(make=_copies),
    DrafterKind.HYBRID: DrafterCode(make=_hybrid, load=_load_draft_or_head),
    DrafterKind.LAYER_SKIP: DrafterCode(make=_layer_skip, load=_load_layers),
}


def make_drafter(kind: DrafterKind, pair: ModelPair, history: SuffixIndex | None = None) -> Drafter:
    """A drafter of `kind` on `pair` for one session. A suffix drafter (also the hybrid's) reads the
    pair's history, past sessions and the target's own texts; given `history`, it reads that and the
    target's texts, and leaves it as it is."""
    return REGISTRY[kind].make(pair, history)


def load_drafter(
    kind: DrafterKind,
    target: LoadedModel | RemoteTarget,
    draft: str | None,
    layers: int | None,
    options: LoadOptions,
    progress: Progress | None = None,
) -> DrafterModels:
    """What `kind` drafts with beside `target`, loaded; refused where it does not run there."""
    kind.refuse(target_path(target), draft)
    if kind.needs_model and not draft:
        raise SpecDeckError(f"The {kind.label} drafter needs a model: name one with --draft.")
    return REGISTRY[kind].load(target, draft, layers, options, progress)
