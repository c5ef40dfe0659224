"""SpecDeck's engine: speculative and plain decoding on Hugging Face causal LMs, Qt-free.

Front ends use `load_model`, `make_drafter`, `encode_prompt` and `generate`, and read the typed
events that `generate` yields.
"""

from specdeck.engine.config import DecodeConfig
from specdeck.engine.decoding import generate
from specdeck.engine.drafters import Drafter, DraftModelDrafter, FeatureHeadDrafter, PromptLookupDrafter, Proposal
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
from specdeck.engine.models import (
    BUILTIN_MODELS,
    DEFAULT_TARGET,
    LoadedModel,
    LoadOptions,
    encode_prompt,
    load_model,
)
from specdeck.engine.pair import DrafterKind, ModelPair, PairSpec
from specdeck.engine.stats import SessionStats, expected_tokens_per_round, predicted_speedup
from specdeck.engine.suffix_drafting import HybridDrafter, SuffixDrafter

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_TARGET",
    "DecodeConfig",
    "DraftModelDrafter",
    "Drafter",
    "DrafterKind",
    "Event",
    "FeatureHeadDrafter",
    "HybridDrafter",
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
