import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tiny import ON_CPU, build_cross_pair, build_pair

from specdeck.engine.loading.models import LoadedModel, load_model


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session", params=["llama", "gpt2"])
def tiny_pair(request, tiny_root) -> tuple[LoadedModel, LoadedModel]:
    """A tiny seeded target and a noisy copy of it as draft (agrees often, not always)."""
    target_dir, draft_dir = build_pair(tiny_root, request.param, noise=0.2)
    return load_model(str(target_dir), ON_CPU), load_model(str(draft_dir), ON_CPU)


@pytest.fixture(scope="session")
def tiny_llama(tiny_root) -> tuple[LoadedModel, LoadedModel]:
    target_dir, draft_dir = build_pair(tiny_root / "llama-only", "llama", noise=0.2)
    return load_model(str(target_dir), ON_CPU), load_model(str(draft_dir), ON_CPU)


@pytest.fixture(scope="session")
def cross_pair(tiny_root) -> tuple[LoadedModel, LoadedModel]:
    """A Llama with a SentencePiece byte-fallback tokenizer and a GPT-2 with a byte-level BPE one,
    both trained on the same text (either drafts for the other)."""
    llama, gpt2 = build_cross_pair(tiny_root / "cross")
    return load_model(str(llama), ON_CPU), load_model(str(gpt2), ON_CPU)
