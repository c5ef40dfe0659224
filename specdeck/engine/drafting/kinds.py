"""Every drafter kind SpecDeck offers, and what it is before anything loads: its command-line
name (`DrafterKind`), its description, the options it reads, what it drafts with, the paths it runs
on (`TargetPath`) and why it runs nowhere else (`RECORDS`). How each kind loads and makes its
drafter is its `DrafterCode` in `specdeck.engine.drafting.registry`: a new drafter is its module,
one record here, one there, and its tests.

Plain Python, no torch: the command line's parser and the window's panels read this before the
engine has imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from specdeck.engine.errors import SpecDeckError
from specdeck.engine.loading.identity import builtin_difference
from specdeck.engine.loading.registry import DEFAULT_DRAFT, DEFAULT_HEAD, names_head


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


EVERY_PATH = frozenset(TargetPath)
IN_THIS_PROCESS = EVERY_PATH - {TargetPath.SERVED}
ON_TORCH = IN_THIS_PROCESS - {TargetPath.LLAMA_CPP}


@dataclass(frozen=True)
class DrafterRecord:
    """What SpecDeck knows of one drafter kind before anything loads (how it loads and drafts: its
    `specdeck.engine.drafting.registry.DrafterCode`)."""

    description: str  # one line, for --help and the window's tooltip
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
    is lives in its `DrafterRecord` (`RECORDS`)."""

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
        return RECORDS[self]

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


def kinds_reading(option: str) -> str:
    """The kinds that read `option` ("--suffix-scope"), as help text names them: 'suffix, hybrid'."""
    return ", ".join(kind.value for kind in DrafterKind if option in kind.record.options)


# Why a kind needs the target in this process: the drafters that read more of it than tokens.
_STATES = "it drafts from the target's hidden states, which a target {where} does not return"
_LAYERS = "it drafts with the target's own first layers, which a target {where} does not expose"

RECORDS: dict[DrafterKind, DrafterRecord] = {
    DrafterKind.DRAFT_MODEL: DrafterRecord(
        "a smaller model, of the target's vocabulary or with a tokenizer of its own",
        model="draft",
        builtin=DEFAULT_DRAFT,
        hugging_face_runs=True,
    ),
    DrafterKind.FEATURE_HEAD: DrafterRecord(
        "a head on the target's own hidden state (EAGLE), trained for that target",
        model="head",
        builtin=DEFAULT_HEAD,
        paths=IN_THIS_PROCESS,
        refused=_STATES,
    ),
    DrafterKind.PROMPT_LOOKUP: DrafterRecord(
        "copies what followed an earlier occurrence of the text's last tokens",
        copies_text=True,
        hugging_face_runs=True,
    ),
    DrafterKind.SUFFIX: DrafterRecord(
        "copies the most frequent continuation from this and earlier texts (--suffix-scope)",
        options=("--suffix-scope",),
        copies_text=True,
    ),
    DrafterKind.HYBRID: DrafterRecord(
        "the suffix drafter's copy where it scores high, else the feature head or the draft model --draft names",
        model="draft or head",
        builtin=DEFAULT_HEAD,
        options=("--suffix-scope",),
        copier="suffix",
    ),
    DrafterKind.LAYER_SKIP: DrafterRecord(
        "the target's own first layers and output layer (early exit; --draft-layers)",
        paths=ON_TORCH,
        refused=_LAYERS,
        options=("--draft-layers",),
        hugging_face_runs=True,
    ),
}
