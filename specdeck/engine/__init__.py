"""SpecDeck's engine: speculative and plain decoding on Hugging Face causal LMs, Qt-free.

Front ends use `load_model`, `make_drafter`, `encode_prompt` and `generate`, and read the typed
events that `generate` yields. The names below are imported at first use, so that importing one part
of the engine (the row kernel, say, to build it while the rest loads) does not import them all.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specdeck.engine.config import DecodeConfig
    from specdeck.engine.drafting.draft_model import DraftModelDrafter
    from specdeck.engine.drafting.drafters import Drafter, PromptLookupDrafter
    from specdeck.engine.drafting.head_drafter import FeatureHeadDrafter
    from specdeck.engine.drafting.kinds import DrafterKind
    from specdeck.engine.drafting.proposals import Proposal
    from specdeck.engine.drafting.suffix_drafting import SuffixDrafter
    from specdeck.engine.errors import SpecDeckError
    from specdeck.engine.events import (
        Event,
        RoundEvent,
        SessionStarted,
        SummaryEvent,
        TokenEvent,
        TokenState,
        event_to_dict,
    )
    from specdeck.engine.loading.models import LoadedModel, LoadOptions, encode_prompt, load_model
    from specdeck.engine.loading.registry import BUILTIN_MODELS, DEFAULT_TARGET
    from specdeck.engine.loop.decoding import generate
    from specdeck.engine.pair import ModelPair
    from specdeck.engine.pair_spec import PairSpec
    from specdeck.engine.stats import SessionStats, expected_tokens_per_round, predicted_speedup

_HOMES = {  # each name's module, imported at first use (importing the engine's parts stays cheap)
    "BUILTIN_MODELS": "specdeck.engine.loading.registry",
    "DEFAULT_TARGET": "specdeck.engine.loading.registry",
    "DecodeConfig": "specdeck.engine.config",
    "DraftModelDrafter": "specdeck.engine.drafting.draft_model",
    "Drafter": "specdeck.engine.drafting.drafters",
    "DrafterKind": "specdeck.engine.drafting.kinds",
    "Event": "specdeck.engine.events",
    "FeatureHeadDrafter": "specdeck.engine.drafting.head_drafter",
    "LoadOptions": "specdeck.engine.loading.models",
    "LoadedModel": "specdeck.engine.loading.models",
    "ModelPair": "specdeck.engine.pair",
    "PairSpec": "specdeck.engine.pair_spec",
    "PromptLookupDrafter": "specdeck.engine.drafting.drafters",
    "Proposal": "specdeck.engine.drafting.proposals",
    "RoundEvent": "specdeck.engine.events",
    "SessionStarted": "specdeck.engine.events",
    "SessionStats": "specdeck.engine.stats",
    "SpecDeckError": "specdeck.engine.errors",
    "SuffixDrafter": "specdeck.engine.drafting.suffix_drafting",
    "SummaryEvent": "specdeck.engine.events",
    "TokenEvent": "specdeck.engine.events",
    "TokenState": "specdeck.engine.events",
    "encode_prompt": "specdeck.engine.loading.models",
    "event_to_dict": "specdeck.engine.events",
    "expected_tokens_per_round": "specdeck.engine.stats",
    "generate": "specdeck.engine.loop.decoding",
    "load_model": "specdeck.engine.loading.models",
    "predicted_speedup": "specdeck.engine.stats",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # found once
    return value


__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_TARGET",
    "DecodeConfig",
    "DraftModelDrafter",
    "Drafter",
    "DrafterKind",
    "Event",
    "FeatureHeadDrafter",
    "LoadOptions",
    "LoadedModel",
    "ModelPair",
    "PairSpec",
    "PromptLookupDrafter",
    "Proposal",
    "RoundEvent",
    "SessionStarted",
    "SessionStats",
    "SpecDeckError",
    "SuffixDrafter",
    "SummaryEvent",
    "TokenEvent",
    "TokenState",
    "encode_prompt",
    "event_to_dict",
    "expected_tokens_per_round",
    "generate",
    "load_model",
    "predicted_speedup",
]
