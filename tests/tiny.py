"""Tiny seeded models and a real byte-level BPE tokenizer, built offline for tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from engine.models import LoadOptions

# What tests of CPU behaviour load with, so that they test the same thing on a machine with a GPU
# (where `auto` would pick it and a half dtype); the GPU set (`-m cuda`) asks for the GPU itself.
ON_CPU = LoadOptions(device="cpu", dtype="float32")

CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Speculative decoding drafts tokens and the target model verifies them in one pass.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Café, naïve, façade, 東京, Zürich, 🙂 and ✓ are multi-byte characters.",
    "Once upon a time there was a small model that guessed what a large model would say.",
]


def build_tokenizer(directory: Path, vocab_size: int = 320) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on CORPUS; saved to `directory`."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    fast.save_pretrained(directory)
    return fast


def build_model(directory: Path, arch: str, vocab_size: int, seed: int, layers: int = 2,
                hidden: int = 64, eos_token_id: int | None = None) -> Path:
    """A randomly initialised (seeded) Llama or GPT-2 saved as safetensors in `directory`."""
    torch.manual_seed(seed)
    if arch == "llama":
        config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=512, eos_token_id=eos_token_id, tie_word_embeddings=False)
        model = LlamaForCausalLM(config)
    elif arch == "gpt2":
        config = GPT2Config(vocab_size=vocab_size, n_embd=hidden, n_layer=layers, n_head=4, n_positions=512,
                            eos_token_id=eos_token_id, bos_token_id=eos_token_id, tie_word_embeddings=False)
        model = GPT2LMHeadModel(config)
    else:
        raise ValueError(arch)
    with torch.no_grad():  # sharper logits than the default init, so greedy choices are not near-ties
        model.get_output_embeddings().weight.mul_(4.0)
    model.save_pretrained(directory)
    return directory


def build_pair(root: Path, arch: str, draft_seed: int = 1, noise: float = 0.0) -> tuple[Path, Path]:
    """A target and a draft sharing a tokenizer. With `noise`, the draft is the target's weights
    plus Gaussian noise (relative), so it agrees with the target often but not always."""
    target_dir, draft_dir = root / f"{arch}-target", root / f"{arch}-draft"
    tokenizer = build_tokenizer(target_dir)
    eos = tokenizer.eos_token_id
    build_model(target_dir, arch, len(tokenizer), seed=0, layers=2, eos_token_id=eos)
    tokenizer.save_pretrained(draft_dir)
    if noise:
        model = (LlamaForCausalLM if arch == "llama" else GPT2LMHeadModel).from_pretrained(target_dir)
        gen = torch.Generator().manual_seed(draft_seed)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn(param.shape, generator=gen) * noise * param.std())
        model.save_pretrained(draft_dir)
    else:
        build_model(draft_dir, arch, len(tokenizer), seed=draft_seed, layers=1, eos_token_id=eos)
    return target_dir, draft_dir


def write_two_prompts(path: Path) -> Path:
    """A two-prompt Spec-Bench-style file in two categories, for benchmark tests."""
    records = [
        {"question_id": 1, "category": "summarization", "turns": ["The quick brown fox jumps over the lazy dog. The quick"]},
        {"question_id": 2, "category": "qa", "turns": ["def add(a, b):\n    return a + b"]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path
