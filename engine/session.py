"""A loaded target/drafter pair and one session on it: what the terminal, the window and the
benchmark share, so that all three decode the same way."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from engine.backends import gguf_file
from engine.config import DecodeConfig
from engine.decoding import generate
from engine.drafters import COPYING_KINDS, DraftModelDrafter, Drafter, FeatureHeadDrafter, PromptLookupDrafter, SuffixDrafter
from engine.errors import SpecDeckError
from engine.events import Event
from engine.heads import LoadedHead, load_feature_head, names_head
from engine.models import DEFAULT_DRAFT, DEFAULT_HEAD, DEFAULT_TARGET, LoadedModel, LoadOptions, Progress, check_vocabularies, encode_prompt, load_model
from engine.suffix import SuffixIndex

DEFAULT_DRAFTER = "prompt-lookup"  # for targets without a built-in draft
DEFAULT_PROMPT = (
    "Summarize in two sentences: Speculative decoding speeds up a large language model by letting a "
    "small draft model propose several tokens that the large model then checks in a single forward pass. "
    "Tokens the large model agrees with are kept, so the output is exactly what the large model alone "
    "would have written."
)


@dataclass
class ModelPair:
    target: LoadedModel
    draft: LoadedModel | None = None
    drafter_kind: str | None = None  # "draft-model", "feature-head", "prompt-lookup", "suffix", or None: plain only
    head: LoadedHead | None = None
    # the texts of this pair's earlier sessions, which a suffix drafter also drafts from (token ids
    # mean something for one tokenizer only, so the history belongs to the pair)
    history: SuffixIndex = field(default_factory=SuffixIndex)

    def make_drafter(self, history: SuffixIndex | None = None) -> Drafter | None:
        """A drafter for one session; a suffix drafter reads `history` instead of the pair's own
        history when given, and leaves it as it is."""
        if self.drafter_kind == "draft-model":
            return DraftModelDrafter(self.draft.model, name=self.draft.name, output_ids=self.draft.output_ids)
        if self.drafter_kind == "feature-head":
            return FeatureHeadDrafter(self.head.head, self.target.model, name=self.head.name,
                                      output_ids=self.head.output_ids)
        if self.drafter_kind == "prompt-lookup":
            return PromptLookupDrafter(device=self.target.device)
        if self.drafter_kind == "suffix":
            return SuffixDrafter(self.history if history is None else history, records=history is None,
                                 device=self.target.device)
        return None

    @property
    def description(self) -> str:
        tail = self.drafter_description if self.drafter_kind else "plain"
        if self.target.backend != "torch":
            return f"target {self.target.name} + {tail} on {self.target.device.type}, {self.target.backend}"
        return f"target {self.target.name} + {tail} on {self.target.device.type} ({str(self.target.dtype).removeprefix('torch.')})"


    @property
    def drafter_description(self) -> str:
        if self.drafter_kind == "draft-model":
            return f"draft {self.draft.name}"
        if self.drafter_kind == "feature-head":
            return f"feature head {self.head.name}"
        return {"prompt-lookup": "prompt lookup", "suffix": "suffix"}.get(self.drafter_kind, "")


def load_pair(target: str | None, draft: str | None, drafter: str | None, device: str = "auto",
              dtype: str = "auto", trust_remote_code: bool = False, plain: bool = False,
              progress: Progress | None = None, backend: str = "torch") -> ModelPair:
    """Load the target and, if the session needs one, the draft; refuse mismatched vocabularies.

    With nothing chosen the default pair is the built-in target and its feature head (its distilled
    draft with the draft-model drafter); another target without a draft gets prompt lookup. A --draft
    that names a feature head (an alias or a folder) picks the feature-head drafter by itself."""
    target = target or DEFAULT_TARGET
    kind, draft = _choose_drafter(target, drafter, draft)
    options = LoadOptions(device=device, dtype=dtype, trust_remote_code=trust_remote_code, backend=backend)
    target_model = load_model(target, options, progress)
    return _attach_drafter(target_model, None if plain else kind, draft, options, progress)


def load_pairs(target: str | None, drafters: Sequence[tuple[str | None, str | None]], device: str = "auto",
               dtype: str = "auto", trust_remote_code: bool = False,
               progress: Progress | None = None, backend: str = "torch") -> list[ModelPair]:
    """One pair per (drafter kind, draft) entry, all sharing one loaded target; each entry is chosen
    as `load_pair` chooses, and every entry is checked before anything loads."""
    target = target or DEFAULT_TARGET
    chosen = _choose_drafters(target, drafters)
    options = LoadOptions(device=device, dtype=dtype, trust_remote_code=trust_remote_code, backend=backend)
    target_model = load_model(target, options, progress)
    return [_attach_drafter(target_model, kind, draft, options, progress) for kind, draft in chosen]


def add_drafters(pair: ModelPair, target: str | None, drafters: Sequence[tuple[str | None, str | None]],
                 device: str = "auto", dtype: str = "auto", trust_remote_code: bool = False,
                 progress: Progress | None = None, backend: str = "torch") -> list[ModelPair]:
    """More pairs on `pair`'s loaded target (named `target` when it was loaded), one per (drafter
    kind, draft) entry, chosen and loaded as `load_pairs` does; the target is not loaded again."""
    chosen = _choose_drafters(target or DEFAULT_TARGET, drafters)
    options = LoadOptions(device=device, dtype=dtype, trust_remote_code=trust_remote_code, backend=backend)
    return [_attach_drafter(pair.target, kind, draft, options, progress) for kind, draft in chosen]


def _choose_drafters(target: str, drafters: Sequence[tuple[str | None, str | None]]) -> list[tuple[str, str | None]]:
    chosen = [_choose_drafter(target, drafter, draft) for drafter, draft in drafters]
    repeated = [kind + (f" {draft}" if draft else "") for kind, draft in chosen if chosen.count((kind, draft)) > 1]
    if repeated:
        raise SpecDeckError(f"The drafter {repeated[0]} is named twice: name each drafter once.")
    return chosen


def _choose_drafter(target: str, drafter: str | None, draft: str | None) -> tuple[str, str | None]:
    """The drafter kind and the draft or head it loads for `target`, or a clear error."""
    if drafter in COPYING_KINDS and draft:
        what = "Prompt lookup" if drafter == "prompt-lookup" else "The suffix drafter"
        raise SpecDeckError(f"{what} needs no draft model: drop --draft or choose --drafter draft-model.")
    if not draft and target == DEFAULT_TARGET:
        draft = {None: DEFAULT_HEAD, "draft-model": DEFAULT_DRAFT, "feature-head": DEFAULT_HEAD}.get(drafter)
    if drafter in ("draft-model", "feature-head") and not draft:
        raise SpecDeckError(f"The {drafter} drafter needs a model: pass --draft "
                            f"(in bench --drafters: {drafter}:MODEL).")
    if drafter is None and draft:
        drafter = "feature-head" if names_head(draft) else "draft-model"
    return drafter or DEFAULT_DRAFTER, draft


def _attach_drafter(target_model: LoadedModel, kind: str | None, draft: str | None, options: LoadOptions,
                    progress: Progress | None) -> ModelPair:
    """The pair of the loaded target and drafter `kind` (None: plain only), loading its draft or head."""
    draft_model = head = None
    if kind == "draft-model":
        if names_head(draft):
            raise SpecDeckError(f"{draft} is a feature head, not a draft model: choose the feature-head drafter.")
        if gguf_file(draft) is None:  # a draft that is no GGUF file runs on torch, whatever runs the target
            options = replace(options, backend="torch")
        draft_model = load_model(draft, options, progress)
        check_vocabularies(target_model, draft_model)
    elif kind == "feature-head":
        head = load_feature_head(draft, target_model, progress)
    return ModelPair(target_model, draft_model, kind, head)


def run_session(pair: ModelPair, prompt: str, config: DecodeConfig, chat: bool = True, plain: bool = False,
                cancel: threading.Event | None = None) -> Iterator[Event]:
    """Encode the prompt and decode: speculatively with the pair's drafter, or plainly."""
    prompt_ids = encode_prompt(pair.target.tokenizer, prompt, chat)
    drafter = None if plain else pair.make_drafter()
    return generate(pair.target, prompt_ids, config, drafter, cancel)
