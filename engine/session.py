"""A loaded target/drafter pair and one session on it: what the terminal, the window and the
benchmark share, so that all three decode the same way."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

from engine.config import DecodeConfig
from engine.decoding import generate
from engine.drafters import DraftModelDrafter, Drafter, PromptLookupDrafter
from engine.errors import SpecDeckError
from engine.events import Event
from engine.models import DEFAULT_DRAFT, DEFAULT_TARGET, LoadedModel, LoadOptions, Progress, check_vocabularies, encode_prompt, load_model

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
    drafter_kind: str | None = None  # "draft-model", "prompt-lookup", or None: plain decoding only

    def make_drafter(self) -> Drafter | None:
        if self.drafter_kind == "draft-model":
            return DraftModelDrafter(self.draft.model, name=self.draft.name, output_ids=self.draft.output_ids)
        if self.drafter_kind == "prompt-lookup":
            return PromptLookupDrafter(device=self.target.device)
        return None

    @property
    def description(self) -> str:
        drafter = {"draft-model": f"draft {self.draft.name}" if self.draft else "", "prompt-lookup": "prompt lookup"}
        tail = drafter.get(self.drafter_kind, "plain")
        return f"target {self.target.name} + {tail} on {self.target.device.type} ({str(self.target.dtype).removeprefix('torch.')})"


def load_pair(target: str | None, draft: str | None, drafter: str | None, device: str = "auto",
              dtype: str = "auto", trust_remote_code: bool = False, plain: bool = False,
              progress: Progress | None = None) -> ModelPair:
    """Load the target and, if the session needs one, the draft; refuse mismatched vocabularies.

    With nothing chosen the default pair is the built-in target and its built-in draft; another
    target without a draft gets prompt lookup."""
    target = target or DEFAULT_TARGET
    if drafter == "prompt-lookup" and draft:
        raise SpecDeckError("Prompt lookup needs no draft model: drop --draft or choose --drafter draft-model.")
    if not draft and drafter in (None, "draft-model") and target == DEFAULT_TARGET:
        draft = DEFAULT_DRAFT
    if drafter == "draft-model" and not draft:
        raise SpecDeckError("The draft-model drafter needs a draft model: pass --draft.")
    kind = None if plain else (drafter or ("draft-model" if draft else DEFAULT_DRAFTER))
    options = LoadOptions(device=device, dtype=dtype, trust_remote_code=trust_remote_code)
    target_model = load_model(target, options, progress)
    draft_model = None
    if kind == "draft-model":
        draft_model = load_model(draft, options, progress)
        check_vocabularies(target_model, draft_model)
    return ModelPair(target_model, draft_model, kind)


def run_session(pair: ModelPair, prompt: str, config: DecodeConfig, chat: bool = True, plain: bool = False,
                cancel: threading.Event | None = None) -> Iterator[Event]:
    """Encode the prompt and decode: speculatively with the pair's drafter, or plainly."""
    prompt_ids = encode_prompt(pair.target.tokenizer, prompt, chat)
    drafter = None if plain else pair.make_drafter()
    return generate(pair.target, prompt_ids, config, drafter, cancel)
