"""A draft with a tokenizer of its own for a target (`specdeck train-cross-draft`): a real pair of
different tokenizers to try offline, which `specdeck.engine.drafting.cross_vocab` drafts with through the text.

Three stages, each resumable from what it left in the output folder:
1. text: the target writes its own answers (the teacher shards of `specdeck.train.teacher_shards`,
   reused when given), which are read back as the bytes the drafter will see (`TokenText`, chat
   markup and all), plus passages of freely licensed existing text (`specdeck.train.texts`) framed
   by the target's chat template; saved in `texts.json`;
2. tokenizer: a byte-level BPE (Sennrich et al. 2016; GPT-2's byte alphabet, so any text is
   spelled) of a few thousand tokens trained on that text with the `tokenizers` library, the
   target's control tokens kept whole so that they have twins in its vocabulary;
3. draft: a small Llama trained from scratch on the text in its own tokens (next-token
   cross-entropy over packed blocks), by the loop every trained drafter runs (`specdeck.train.loop`),
   exported with the best held-out next-token accuracy as a Hugging Face folder with its tokenizer.
The draft learns the target's text, not its distributions: the two vocabularies differ, so there
is no per-token teacher distribution to match.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from specdeck.engine.atomic import building_folder, write_text
from specdeck.engine.cache import cache_root
from specdeck.engine.cores import pin_threads
from specdeck.engine.drafting.vocabulary import TokenText
from specdeck.engine.loading.models import LoadedModel, LoadOptions, load_model
from specdeck.train.corpus import SOURCES
from specdeck.train.loop import HeldOut, batches, split_rows, train_loop
from specdeck.train.student import DraftShape
from specdeck.train.teacher import chat_ids, load_shards
from specdeck.train.teacher_shards import build_teacher_data
from specdeck.train.texts import TEXT_SOURCES, existing_exchanges
from specdeck.train.train import TrainConfig

Progress = Callable[[str], None]
TEXTS_FILE = "texts.json"


@dataclass(frozen=True)
class CrossDraftConfig:
    shape: DraftShape = field(default_factory=lambda: DraftShape(hidden=256, layers=4, intermediate=768))
    vocab_size: int = 4096  # the draft's own byte-level BPE, control tokens included
    seed: int = 0
    answers: int = 128  # chat instructions the target answers itself
    passages: int = 16  # documentation passages the target summarises or answers questions on
    code: int = 32  # code beginnings the target continues
    articles: int = 0  # articles the target writes, then reads back
    answer_tokens: int = 192
    generation_batch: int = 64
    teacher_shards: int = 0  # stop the teacher after this many shards (0: all)
    exchanges: int = 400  # passages of existing text (`specdeck.train.texts`), as chat answers
    max_length: int = 256  # tokens per training block (the draft's own)
    steps: int = 400
    batch_sequences: int = 8
    lr: float = 2e-3
    warmup: int = 20
    eval_every: int = 50
    bfloat16: bool = True  # train under bfloat16 autocast (float32 weights and optimizer)
    threads: int = 0  # 0: torch's default

    def teacher(self) -> TrainConfig:
        """The settings `build_teacher_data` reads: what the target writes."""
        return TrainConfig(
            seed=self.seed,
            answers=self.answers,
            passages=self.passages,
            code=self.code,
            articles=self.articles,
            answer_tokens=self.answer_tokens,
            generation_batch=self.generation_batch,
            teacher_shards=self.teacher_shards,
            max_length=self.max_length,
        )

    @property
    def writes(self) -> bool:
        return bool(self.answers or self.passages or self.code or self.articles)


def default_folder(target_name: str) -> Path:
    """Where a target's own-tokenizer draft is trained: SpecDeck's cache, `cross-draft/<target>`."""
    return cache_root() / "cross-draft" / target_name.replace("/", "--")


def teacher_texts(
    target: LoadedModel, config: CrossDraftConfig, shards: Path, write: bool, progress: Progress
) -> list[str]:
    """The training text: every sequence of the teacher shards in `shards` (with `write`, the
    target first writes those the config asks for and the folder lacks) as the text the drafter
    reads, then `config.exchanges` passages of existing text in the target's chat format."""
    if write and config.writes:
        build_teacher_data(target, shards, config.teacher(), progress)
    spelled = TokenText(target.tokenizer)
    texts = [spelled.text(ids.tolist()).decode("utf-8", errors="replace") for ids in load_shards(shards).ids]
    if config.exchanges:
        progress("reading existing text (Python documentation and standard library, WordNet)")
        for exchange in existing_exchanges(config.seed)[: config.exchanges]:
            ids = chat_ids(target, exchange.instruction, exchange.answer)
            texts.append(spelled.text(ids).decode("utf-8", errors="replace"))
    return texts


def train_tokenizer(texts: list[str], size: int, controls: list[str], eos: str, chat_template: str | None):
    """A byte-level BPE of `size` tokens trained on `texts`, with `controls` (the target's control
    tokens) as single special tokens and `eos` as its end of text; it adds no token of its own
    around a text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=size,
        special_tokens=controls,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=eos, pad_token=eos, chat_template=chat_template
    )


def pack(tokenizer, texts: list[str], length: int) -> torch.Tensor:
    """The texts' tokens end to end, cut into blocks of `length` + 1 (the last token of a block is
    the first of the next): (blocks, length + 1)."""
    ids = [token for text in texts for token in tokenizer(text, add_special_tokens=False)["input_ids"]]
    count = max(0, (len(ids) - 1) // length)
    stream = torch.tensor(ids[: count * length + 1], dtype=torch.long)
    return (
        torch.stack([stream[i * length : (i + 1) * length + 1] for i in range(count)])
        if count
        else torch.zeros(0, length + 1, dtype=torch.long)
    )


def build_cross_draft(tokenizer, shape: DraftShape, seed: int, positions: int, rope: dict | None):
    """A seeded Llama over the draft's own vocabulary, randomly initialised, with the target's
    `positions` and RoPE settings (so it reads as long a context as the target)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    head_dim = min(shape.head_dim, shape.hidden)
    heads = shape.hidden // head_dim
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=head_dim,
        max_position_embeddings=positions,
        rope_parameters=rope or {"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def next_token_loss(model, blocks: torch.Tensor, bfloat16: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy of each next token of `blocks`, and whether the draft's argmax is it."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16):
        logits = model(input_ids=blocks[:, :-1]).logits
    logits = logits.float().flatten(0, 1)
    targets = blocks[:, 1:].flatten()
    return torch.nn.functional.cross_entropy(logits, targets), (logits.argmax(-1) == targets).float()


@torch.no_grad()
def evaluate(model, blocks: torch.Tensor, rows: list[int], batch: int, bfloat16: bool) -> tuple[float, float]:
    """Mean loss and next-token accuracy over `rows` of `blocks`."""
    model.eval()
    losses, hits = [], []
    for i in range(0, len(rows), batch):
        loss, hit = next_token_loss(model, blocks[rows[i : i + batch]], bfloat16)
        losses.append(loss.item() * len(hit))
        hits.append(hit)
    model.train()
    hit = torch.cat(hits)
    return sum(losses) / max(1, len(hit)), hit.mean().item()


def model_card(
    target_name: str, config: CrossDraftConfig, tokenizer, texts: int, blocks: int, step: int, held: HeldOut
) -> str:
    """What the draft is, what it learnt from (with licenses) and how to make it again."""
    shape = config.shape
    listed = {**SOURCES, **TEXT_SOURCES} if config.exchanges else SOURCES  # existing text only where read
    sources = "\n".join(f"- {name}: {text}" for name, text in listed.items())
    return f"""# Draft with its own tokenizer for {target_name}

A small Llama (`LlamaForCausalLM`) that drafts for {target_name} through the text: its tokenizer,
a byte-level BPE of {len(tokenizer)} tokens trained on the same text, is not the target's, so SpecDeck
pairs them as "different tokenizers" (greedy and sampling both exact).

## Architecture
{shape.layers} layers, hidden size {shape.hidden}, MLP {shape.intermediate}, head size {shape.head_dim},
tied embedding, trained from a random start.

## Training
Next-token cross-entropy on {texts} texts ({blocks} blocks of {config.max_length} of its tokens): the
target's own answers and passages of existing text in the target's chat format; {step} steps of
{config.batch_sequences} blocks, AdamW, lr {config.lr}, seed {config.seed}. Held-out loss {held.figures[0]:.3f},
next-token accuracy {held.agreement:.3f} (every 20th block, never trained on).

Settings: `{json.dumps(asdict(config))}`

Made with `specdeck train-cross-draft` (see SpecDeck's docs/training.md).

## Data
{sources}
No benchmark prompts were used.
"""


def export_cross_draft(model, tokenizer, folder: Path, card: str) -> None:
    """The draft in float16 safetensors with its tokenizer and model card, as one folder."""
    with building_folder(folder) as staging:  # a reader never loads half a draft
        copy.deepcopy(model).to(torch.float16).save_pretrained(staging)  # the training copy stays float32
        tokenizer.save_pretrained(staging)
        (staging / "README.md").write_text(card, encoding="utf-8")


def _texts(target_name: str, out: Path, config: CrossDraftConfig, teacher: Path | None, progress: Progress) -> dict:
    """The training text and what the draft takes from the target (its control tokens, chat
    template, positions and RoPE settings), made once and kept in `texts.json`, which a resumed
    run reads back. Teacher shards from elsewhere (`teacher`) are read, never added to."""
    path = out / TEXTS_FILE
    if not path.exists():
        target = load_model(target_name, LoadOptions(device="cpu", dtype=config.teacher().teacher_dtype), progress)
        tokenizer: Any = target.tokenizer
        settings: Any = target.model.config
        texts = teacher_texts(target, config, teacher or out / "teacher", teacher is None, progress)
        controls = sorted({str(t) for t in tokenizer.all_special_tokens} | {tokenizer.eos_token})
        record = {
            "texts": texts,
            "controls": controls,
            "eos": tokenizer.eos_token,
            "chat_template": tokenizer.chat_template,
            "positions": settings.max_position_embeddings,
            "rope": getattr(settings, "rope_parameters", None),
        }
        write_text(path, json.dumps(record, ensure_ascii=False))
    return json.loads(path.read_text(encoding="utf-8"))


def train_cross_draft(
    target_name: str,
    out: Path,
    config: CrossDraftConfig,
    teacher: Path | None = None,
    resume: bool = False,
    progress: Progress = print,
    until: int | None = None,
) -> Path:
    """Run the three stages into `out` (teacher shards in `teacher`, default `out/teacher`); return
    the folder of the exported draft (`out/draft`), the checkpoint with the best held-out accuracy.

    `until` stops this call after that step (checkpointed) without changing the learning-rate
    schedule, which always spans `config.steps`."""
    from transformers import AutoTokenizer

    if config.threads:
        pin_threads(config.threads)
    out.mkdir(parents=True, exist_ok=True)
    record = _texts(target_name, out, config, teacher, progress)
    texts = record["texts"]
    if not (out / "tokenizer").is_dir():
        progress(f"training a byte-level BPE of {config.vocab_size} tokens on {len(texts)} texts")
        tokenizer = train_tokenizer(
            texts, config.vocab_size, record["controls"], record["eos"], record["chat_template"]
        )
        with building_folder(out / "tokenizer") as staging:
            tokenizer.save_pretrained(staging)
    tokenizer = AutoTokenizer.from_pretrained(out / "tokenizer")
    blocks = pack(tokenizer, texts, config.max_length)
    progress(f"{len(texts)} texts, {blocks.numel():,} tokens of its own in {len(blocks)} blocks")
    held_out_rows, training = split_rows(len(blocks))
    draft = build_cross_draft(tokenizer, config.shape, config.seed, record["positions"], record["rope"])
    optimizer = torch.optim.AdamW(draft.parameters(), lr=config.lr, weight_decay=0.0, betas=(0.9, 0.98))

    def batch_loss(rows: list[int], step: int) -> tuple[torch.Tensor, str]:
        loss, hit = next_token_loss(draft, blocks[rows], config.bfloat16)
        return loss, f"{hit.mean().item():.3f}"

    def held_out(step: int) -> HeldOut:
        loss, accuracy = evaluate(draft, blocks, held_out_rows, config.batch_sequences, config.bfloat16)
        progress(f"held-out loss {loss:.3f} next-token accuracy {accuracy:.3f}")
        return HeldOut(accuracy, (loss,))

    def export(step: int, held: HeldOut) -> None:
        card = model_card(target_name, config, tokenizer, len(texts), len(blocks), step, held)
        export_cross_draft(draft, tokenizer, out / "draft", card)

    train_loop(
        draft,
        optimizer,
        config,
        training,
        len(blocks),
        out / "checkpoint.pt",
        epoch_batches=lambda epoch: batches(len(training), config.batch_sequences, config.seed, epoch),
        batch_loss=batch_loss,
        evaluate=held_out,
        export=export,
        floor=0.1,
        resume=resume,
        progress=progress,
        until=until,
    )
    return out / "draft"
