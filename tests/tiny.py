"""Tiny seeded models and real tokenizers (byte-level BPE, SentencePiece with byte fallback), built
offline for tests."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from specdeck.engine.forward import row_kernel
from specdeck.engine.forward.linear import packed_available
from specdeck.engine.loading.models import LoadOptions

# What tests of CPU behaviour load with, so that they test the same thing on a machine with a GPU
# (where `auto` would pick it and a half dtype); the GPU set (`-m cuda`) asks for the GPU itself.
ON_CPU = LoadOptions(device="cpu", dtype="float32")
# The product paths that give each row its own call's bits and run on this machine (`specdeck.engine.forward.linear`)
PACKED_PATHS = [
    path
    for path, missing in (("packed", packed_available), ("kernel", row_kernel.unavailable))
    if missing(torch.zeros(2, 2)) is None
]

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
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    fast.save_pretrained(directory)
    return fast


def build_sentencepiece_tokenizer(directory: Path, vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """A Llama-style tokenizer trained on CORPUS: SentencePiece pieces ("▁the") with a space before
    the first word, byte fallback ("<0xE6>") for characters outside its 40-character alphabet, and
    "<s>" before every text."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    # the alphabet chosen here, ties broken by the character: the trainer's own choice among equally
    # frequent characters varies from run to run
    counts = Counter("".join(CORPUS).replace(" ", "\u2581"))
    alphabet = sorted(counts, key=lambda char: (-counts[char], char))[:40]
    tok.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=vocab_size, limit_alphabet=40, initial_alphabet=alphabet, special_tokens=["<unk>", "<s>", "</s>"]
        ),
    )
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(directory)
    return fast


def build_model(
    directory: Path,
    arch: str,
    vocab_size: int,
    seed: int,
    layers: int = 2,
    hidden: int = 64,
    eos_token_id: int | None = None,
) -> Path:
    """A randomly initialised (seeded) Llama or GPT-2 saved as safetensors in `directory`."""
    torch.manual_seed(seed)
    if arch == "llama":
        config = LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            eos_token_id=eos_token_id,
            tie_word_embeddings=False,
        )
        model = LlamaForCausalLM(config)
    elif arch == "gpt2":
        config = GPT2Config(
            vocab_size=vocab_size,
            n_embd=hidden,
            n_layer=layers,
            n_head=4,
            n_positions=512,
            eos_token_id=eos_token_id,
            bos_token_id=eos_token_id,
            tie_word_embeddings=False,
        )
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


def train_on_corpus(directory: Path, tokenizer, steps: int = 120, seed: int = 0) -> Path:
    """Train the model saved in `directory` on CORPUS in its own tokens (seeded, a few seconds), so
    that two models with different tokenizers continue the same text the same way."""
    model = AutoModelForCausalLM.from_pretrained(directory)
    stream = []
    for text in CORPUS:
        stream += tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
    batch = torch.tensor([stream])
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(directory)
    return directory


def build_cross_pair(root: Path) -> tuple[Path, Path]:
    """Two models trained on CORPUS, each with a tokenizer of its own: a Llama with a SentencePiece
    byte-fallback tokenizer and a GPT-2 with a byte-level BPE one (either drafts for the other)."""
    llama, gpt2 = root / "llama-sentencepiece", root / "gpt2-byte-level"
    pieces = build_sentencepiece_tokenizer(llama)
    build_model(llama, "llama", len(pieces), seed=0, eos_token_id=pieces.eos_token_id)
    train_on_corpus(llama, pieces)
    bpe = build_tokenizer(gpt2, vocab_size=400)
    build_model(gpt2, "gpt2", len(bpe), seed=1, eos_token_id=bpe.eos_token_id)
    train_on_corpus(gpt2, bpe)
    return llama, gpt2


def write_two_prompts(path: Path) -> Path:
    """A two-prompt Spec-Bench-style file in two categories, for benchmark tests."""
    records = [
        {
            "question_id": 1,
            "category": "summarization",
            "turns": ["The quick brown fox jumps over the lazy dog. The quick"],
        },
        {"question_id": 2, "category": "qa", "turns": ["def add(a, b):\n    return a + b"]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def head_session_keeps_plain_text(target, head, prompt_ids: list[int], config):
    """A greedy session of the loaded feature head `head` beside `target`: asserts its kept tokens are
    plain decoding's, and returns its summary event (what it drafted, accepted and copied)."""
    from specdeck.engine import TokenEvent, generate
    from specdeck.engine.drafting.head_drafter import FeatureHeadDrafter

    plain = [e.token_id for e in generate(target, prompt_ids, config) if isinstance(e, TokenEvent)]
    drafter = FeatureHeadDrafter(head.head, target.model, name=head.name, output_ids=head.output_ids)
    events = list(generate(target, prompt_ids, config, drafter))
    assert [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept] == plain
    return events[-1]


def set_tiny_pair(win, tiny_pair, max_new_tokens: int) -> None:
    """Set `win` to load the tiny pair with the draft-model drafter on the CPU, in float32, on a
    short raw prompt."""
    target, draft = tiny_pair
    win.model_panel.target.set_value(str(target))
    win.model_panel.drafter.setCurrentText("draft model")
    win.model_panel.draft.set_value(str(draft))
    win.model_panel.device.setCurrentText("cpu")  # the same test on a machine with a GPU
    win.model_panel.dtype.setCurrentText("float32")
    win.decoding_panel.prompt.setPlainText("The quick brown fox")
    win.decoding_panel.chat.setChecked(False)
    win.decoding_panel.max_new_tokens.setValue(max_new_tokens)
