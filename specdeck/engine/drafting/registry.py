"""Every drafter kind SpecDeck offers, registered once (`REGISTRY`): its command-line name
(`DrafterKind`), its description, the options it reads, what it loads beside the target, the paths
it runs on (`TargetPath`) and how a session's drafter is made on a loaded pair.

The pair (`specdeck.engine.pair`), the session (`specdeck.engine.session`), the command line and
the window read this table instead of branching on the kind, as vLLM's engine asks each proposer
what it supports: a new drafter is its module, one `DrafterRecord` here and its tests
(`tests/engine/test_every_drafter.py` runs every record on every path it claims, and checks that
every other path is refused).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING

from specdeck.engine.drafting.cross_vocab import CrossVocabularyDrafter
from specdeck.engine.drafting.draft_model import DraftModelDrafter
from specdeck.engine.drafting.drafters import Drafter, PromptLookupDrafter
from specdeck.engine.drafting.head_drafter import FeatureHeadDrafter
from specdeck.engine.drafting.heads import LoadedHead, load_feature_head, names_head
from specdeck.engine.drafting.layer_skip import LayerChoice, LayerSkipDrafter, choose_layers
from specdeck.engine.drafting.suffix import SuffixIndex
from specdeck.engine.drafting.suffix_drafting import HYBRID_MIN_SCORE, SuffixDrafter
from specdeck.engine.drafting.vocabulary import VocabularyMatch, match_vocabularies
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward.lean_weights import weights_of
from specdeck.engine.forward.llama_families import supports
from specdeck.engine.forward.llamacpp_backend import LlamaCppModel
from specdeck.engine.loading.backends import gguf_file
from specdeck.engine.loading.identity import builtin_difference
from specdeck.engine.loading.models import LoadedModel, LoadOptions, Progress, load_model
from specdeck.engine.loading.registry import DEFAULT_DRAFT, DEFAULT_HEAD
from specdeck.engine.remote.remote_target import RemoteTarget

if TYPE_CHECKING:
    from specdeck.engine.pair import ModelPair


class TargetPath(str, Enum):
    """Where the target runs, as a drafter sees it: what it can read of the target there."""

    KERNEL = "row kernel"  # torch on this CPU, its products on SpecDeck's row kernel
    TORCH = "torch"  # torch on this CPU, its products through F.linear or oneDNN
    LLAMA_CPP = "llama.cpp"  # llama.cpp in this process: logits and last states, no layers
    SERVED = "server"  # a served target: tokens' log-probabilities, no states
    GPU = "GPU"  # torch on a CUDA or MPS device

    @property
    def where(self) -> str:
        """'on llama.cpp', 'on a server', as a sentence names the path."""
        return {
            TargetPath.KERNEL: "on the row kernel",
            TargetPath.TORCH: "on torch's own products",
            TargetPath.LLAMA_CPP: "on llama.cpp",
            TargetPath.SERVED: "on a server",
            TargetPath.GPU: "on a GPU",
        }[self]

    @property
    def instead(self) -> str:
        """What else a refused drafter can do about this path, as the end of a sentence, or ''."""
        return ", or load the target with --backend torch" if self is TargetPath.LLAMA_CPP else ""


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


EVERY_PATH = frozenset(TargetPath)
IN_THIS_PROCESS = EVERY_PATH - {TargetPath.SERVED}
ON_TORCH = IN_THIS_PROCESS - {TargetPath.LLAMA_CPP}


@dataclass(frozen=True)
class DrafterModels:
    """What a drafter kind loads beside the target (`DrafterRecord.load`)."""

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
class DrafterRecord:
    """What SpecDeck knows of one drafter kind."""

    description: str  # one line, for --help and the window's tooltip
    make: Callable[[ModelPair, SuffixIndex | None], Drafter]  # a drafter for one session on a loaded pair
    load: Loader = _load_nothing
    model: str = ""  # what --draft names for it: "" (nothing), "draft", "head" or "draft or head"
    builtin: str | None = None  # the bundled model it drafts with beside the built-in target
    paths: frozenset[TargetPath] = EVERY_PATH
    refused: str = ""  # why it runs nowhere else ("{where}": the refused path's, 'on a server')
    options: tuple[str, ...] = ()  # what it reads besides --drafter and --draft
    copies_text: bool = False  # it copies from the text, so no copier runs before it
    copier: str = "prompt lookup"  # what copies before it where the text repeats (`--lookup`)
    # Hugging Face's assisted generation has it (`assistant_model=`, `prompt_lookup_num_tokens=`,
    # `assistant_early_exit=`): a baseline `specdeck bench` can time
    hugging_face_runs: bool = False


class DrafterKind(str, Enum):
    """What proposes the draft tokens; the value is the kind's command-line name. What each kind
    is lives in its `DrafterRecord` (`REGISTRY`)."""

    DRAFT_MODEL = "draft-model"
    FEATURE_HEAD = "feature-head"
    PROMPT_LOOKUP = "prompt-lookup"
    SUFFIX = "suffix"
    HYBRID = "hybrid"
    LAYER_SKIP = "layer-skip"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def named(cls, name: str, where: str = "--drafter") -> DrafterKind:
        """The kind with command-line name `name`, or a `SpecDeckError` listing the kinds."""
        try:
            return cls(name.strip())
        except ValueError:
            raise SpecDeckError(
                f"Unknown drafter {name!r} in {where}: choose from {', '.join(kind.value for kind in cls)}."
            ) from None

    @property
    def record(self) -> DrafterRecord:
        return REGISTRY[self]

    @property
    def label(self) -> str:
        """The kind as the window and the reports name it: 'draft model', 'prompt lookup'."""
        return self.value.replace("-", " ")

    @property
    def description(self) -> str:
        return self.record.description

    @property
    def needs_model(self) -> bool:
        """Whether the kind loads a model of its own (a draft or a feature head)."""
        return bool(self.record.model)

    @property
    def reads_head(self) -> bool:
        """Whether the kind drafts with a feature head when its draft names one."""
        return "head" in self.record.model

    @property
    def reads_history(self) -> bool:
        """Whether the kind drafts from earlier texts (`DecodeConfig.suffix_scope`)."""
        return "--suffix-scope" in self.record.options

    @property
    def takes_layers(self) -> bool:
        """Whether the kind drafts with a number of the target's layers (`--draft-layers`)."""
        return "--draft-layers" in self.record.options

    @property
    def copies_text(self) -> bool:
        """Whether the kind copies from the text: no copier runs before such a drafter."""
        return self.record.copies_text

    @property
    def hugging_face_runs(self) -> bool:
        return self.record.hugging_face_runs

    def builtin_model(self, target: str) -> str | None:
        """The bundled draft or head of this kind for `target`, if SpecDeck ships one: for the
        built-in target, or a file of the same model (`specdeck.engine.loading.identity`)."""
        builtin = self.record.builtin
        return builtin if builtin and builtin_difference(target) is None else None

    def drafts_as(self, draft: str | None) -> DrafterKind:
        """The kind whose model this kind drafts with: for one that takes a draft model or a feature
        head, the kind of the one `draft` names; else itself."""
        if self.record.model != "draft or head":
            return self
        return DrafterKind.FEATURE_HEAD if names_head(draft) else DrafterKind.DRAFT_MODEL

    def paths(self, draft: str | None = None) -> frozenset[TargetPath]:
        """The paths it runs on with `draft`: its own, and its model's kind's (`drafts_as`)."""
        return self.record.paths & self.drafts_as(draft).record.paths

    def refusal(self, path: TargetPath, draft: str | None = None) -> str | None:
        """Why this kind with `draft` does not run on `path`, and what does there; None where it runs."""
        if path in self.paths(draft):
            return None
        model = self.drafts_as(draft)
        refusing = self.record if path not in self.record.paths else model.record
        with_model = f" with a {model.label}" if model is not self and refusing is model.record else ""
        others = [kind.value for kind in DrafterKind if path in kind.record.paths]
        choose = ", ".join(others[:-1]) + f" or {others[-1]}" if len(others) > 1 else "".join(others)
        why = refusing.refused.format(where=path.where)
        return f"The {self} drafter{with_model} does not run {path.where}: {why}. Choose {choose} there{path.instead}."

    def refuse(self, path: TargetPath | None, draft: str | None = None) -> None:
        """Raise `refusal` as a `SpecDeckError` where this kind does not run on `path` (None: not known yet)."""
        why = self.refusal(path, draft) if path is not None else None
        if why:
            raise SpecDeckError(why)

    def describe(self, model: str | None) -> str:
        """The drafter as reports name it: 'draft NAME', 'feature head NAME', 'prompt lookup'."""
        if self.record.model == "draft or head":
            return f"{self.label} {self.drafts_as(model).describe(model)}"
        return {"draft": f"draft {model}", "head": f"feature head {model}"}.get(self.record.model, self.label)

    def make_drafter(self, pair: ModelPair, history: SuffixIndex | None = None) -> Drafter:
        """A drafter of this kind on `pair` for one session. A suffix drafter (also the hybrid's)
        reads the pair's history, past sessions and the target's own texts; given `history`, it
        reads that and the target's texts, and leaves it as it is."""
        return self.record.make(pair, history)

    def load(
        self,
        target: LoadedModel | RemoteTarget,
        draft: str | None,
        layers: int | None,
        options: LoadOptions,
        progress: Progress | None = None,
    ) -> DrafterModels:
        """What this kind drafts with beside `target`, loaded; refused where it does not run there."""
        self.refuse(target_path(target), draft)
        if self.needs_model and not draft:
            raise SpecDeckError(f"The {self.label} drafter needs a model: name one with --draft.")
        return self.record.load(target, draft, layers, options, progress)


def kinds_reading(option: str) -> str:
    """The kinds that read `option` ("--suffix-scope"), as help text names them: 'suffix, hybrid'."""
    return ", ".join(kind.value for kind in DrafterKind if option in kind.record.options)


# Why a kind needs the target in this process: the drafters that read more of it than tokens.
_STATES = "it drafts from the target's hidden states, which a target {where} does not return"
_LAYERS = "it drafts with the target's own first layers, which a target {where} does not expose"

REGISTRY: dict[DrafterKind, DrafterRecord] = {
    DrafterKind.DRAFT_MODEL: DrafterRecord(
        "a smaller model, of the target's vocabulary or with a tokenizer of its own",
        make=_model_drafter,
        load=_load_draft,
        model="draft",
        builtin=DEFAULT_DRAFT,
        hugging_face_runs=True,
    ),
    DrafterKind.FEATURE_HEAD: DrafterRecord(
        "a head on the target's own hidden state (EAGLE), trained for that target",
        make=_model_drafter,
        load=_load_head,
        model="head",
        builtin=DEFAULT_HEAD,
        paths=IN_THIS_PROCESS,
        refused=_STATES,
    ),
    DrafterKind.PROMPT_LOOKUP: DrafterRecord(
        "copies what followed an earlier occurrence of the text's last tokens",
        make=lambda pair, history: PromptLookupDrafter(device=pair.target.device),
        copies_text=True,
        hugging_face_runs=True,
    ),
    DrafterKind.SUFFIX: DrafterRecord(
        "copies the most frequent continuation from this and earlier texts (--suffix-scope)",
        make=_copies,
        options=("--suffix-scope",),
        copies_text=True,
    ),
    DrafterKind.HYBRID: DrafterRecord(
        "the suffix drafter's copy where it scores high, else the feature head or the draft model --draft names",
        make=_hybrid,
        load=_load_draft_or_head,
        model="draft or head",
        builtin=DEFAULT_HEAD,
        options=("--suffix-scope",),
        copier="suffix",
    ),
    DrafterKind.LAYER_SKIP: DrafterRecord(
        "the target's own first layers and output layer (early exit; --draft-layers)",
        make=_layer_skip,
        load=_load_layers,
        paths=ON_TORCH,
        refused=_LAYERS,
        options=("--draft-layers",),
        hugging_face_runs=True,
    ),
}
