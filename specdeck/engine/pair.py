"""A loaded target/drafter pair (`ModelPair`), and how a `PairSpec` (`specdeck.engine.pair_spec`,
what to load) loads: its options and a served target's settings. What each kind of drafter is,
`DrafterKind`, is registered in `specdeck.engine.drafting.kinds`, how it loads and drafts in
`specdeck.engine.drafting.registry`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdeck.engine.drafting.drafters import Drafter
from specdeck.engine.drafting.heads import LoadedHead
from specdeck.engine.drafting.kinds import DrafterKind
from specdeck.engine.drafting.layer_skip import LayerChoice
from specdeck.engine.drafting.past_sessions import PastSessions
from specdeck.engine.drafting.registry import make_drafter
from specdeck.engine.drafting.suffix import SuffixIndex
from specdeck.engine.drafting.vocabulary import VocabularyMatch
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.loading.models import LoadedModel, LoadOptions
from specdeck.engine.pair_spec import PairSpec, default_drafter
from specdeck.engine.remote.remote_target import RemoteSettings, RemoteTarget

__all__ = ["DrafterKind", "ModelPair", "PairSpec", "default_drafter", "load_options", "remote_settings"]


def load_options(spec: PairSpec) -> LoadOptions:
    """How `spec`'s target (and a draft of it) loads in this process."""
    return LoadOptions(
        device=spec.device, dtype=spec.dtype, trust_remote_code=spec.trust_remote_code, backend=spec.backend
    )


def remote_settings(spec: PairSpec) -> RemoteSettings:
    """Where `spec`'s served target is."""
    return RemoteSettings(spec.target, spec.target_model, spec.timeout_s)


@dataclass
class ModelPair:
    """A loaded (or served) target and its drafter's model, if the drafter has one."""

    target: LoadedModel | RemoteTarget
    draft_model: LoadedModel | None = None  # the loaded draft model (`PairSpec.draft` names it)
    drafter_kind: DrafterKind | None = None  # None: plain decoding only
    head: LoadedHead | None = None
    # the texts of this pair's earlier sessions, which a suffix drafter also drafts from (token ids
    # mean something for one tokenizer only, so the history belongs to the pair)
    history: SuffixIndex = field(default_factory=SuffixIndex)
    vocabulary: VocabularyMatch | None = None  # how a draft model's vocabulary relates to the target's
    past: PastSessions | None = None  # past sessions' texts (suffix scope `all`); the target's tokenizer's by default
    layer_choice: LayerChoice | None = None  # the layer-skip drafter's layers (`specdeck.engine.drafting.layer_skip`)
    note: str = ""  # why the drafter, left to its default, is not SpecDeck's own (`PairSpec.default_note`)

    def __post_init__(self) -> None:
        if self.past is None:
            self.past = PastSessions(self.target.tokenizer)

    @property
    def remote(self) -> bool:
        """Whether the target is served (`specdeck.engine.remote.remote_target`)."""
        return isinstance(self.target, RemoteTarget)

    @property
    def local_target(self) -> LoadedModel:
        """The target, where what asks for it needs its model in this process."""
        if isinstance(self.target, RemoteTarget):
            raise SpecDeckError(
                f"{self.target.describe()} is served, not loaded here: this needs a target in this "
                "process (load the model itself with --target)."
            )
        return self.target

    @property
    def reads_history(self) -> bool:
        """Whether its drafter drafts from earlier texts (`DrafterKind.reads_history`)."""
        return self.drafter_kind is not None and self.drafter_kind.reads_history

    @property
    def copies_text(self) -> bool:
        """Whether its drafter only copies text, with no model of its own (`DrafterKind.copies_text`)."""
        return self.drafter_kind is not None and self.drafter_kind.copies_text

    @property
    def cross_vocabulary(self) -> bool:
        """Whether the draft model has a tokenizer of its own (`specdeck.engine.drafting.cross_vocab`)."""
        return self.vocabulary is not None and not self.vocabulary.same

    @property
    def hugging_face_runs(self) -> bool:
        """Whether Hugging Face's assisted generation runs this pair's drafter (`DrafterKind`); a
        draft with a tokenizer of its own only where its vocabulary size differs from the target's,
        by which Hugging Face tells different tokenizers from the same one. A draft on llama.cpp is
        no model Hugging Face can run."""
        if not self.drafter_kind or not self.drafter_kind.hugging_face_runs or self.remote:
            return False
        if self.draft_model is None:
            return True
        if self.draft_model.backend != "torch":
            return False
        if not self.cross_vocabulary:
            return True
        return self.draft_model.model.config.vocab_size != self.local_target.model.config.vocab_size

    def make_drafter(self, history: SuffixIndex | None = None) -> Drafter | None:
        """A drafter for one session (`DrafterCode.make`), or None for plain decoding."""
        return make_drafter(self.drafter_kind, self, history) if self.drafter_kind else None

    @property
    def description(self) -> str:
        tail = self.drafter_description if self.drafter_kind else "plain"
        if isinstance(self.target, RemoteTarget):
            return f"target {self.target.describe()} + {tail} (greedy only)"
        where = f"on {self.target.device.type}, {self.target.runs}"
        case = f"; {self.vocabulary.describe()}" if self.vocabulary is not None and not self.vocabulary.same else ""
        return f"target {self.target.name} + {tail} {where}{case}"

    @property
    def drafter_model(self) -> str | None:
        """The name of the drafter's draft model or feature head, if it has one."""
        return self.draft_model.name if self.draft_model else self.head.name if self.head else None

    @property
    def drafter_description(self) -> str:
        if not self.drafter_kind:
            return ""
        if self.layer_choice is not None:
            return f"{self.drafter_kind.label} ({self.layer_choice.describe()})"
        return self.drafter_kind.describe(self.drafter_model) + (
            " (its own tokenizer)" if self.cross_vocabulary else ""
        )
