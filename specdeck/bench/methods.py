"""The timed methods a benchmark compares, each giving one `Run` per prompt.

- `plain`, `speculative`: SpecDeck's own loop (`specdeck.engine.loop.decoding.generate`); prefill and decoding
  are timed apart by the loop itself.
- `hf`: Hugging Face `generate()`, greedy or sampling with the same settings.
- `hf-assisted`: Hugging Face's own speculative decoding with the same drafter and a fixed K:
  `assistant_model=` with `num_assistant_tokens_schedule="constant"` and
  `assistant_confidence_threshold=0`, `prompt_lookup_num_tokens=K`, or for layer skip the target
  as its own assistant through its first L layers (`assistant_early_exit=L`). A draft with a tokenizer of
  its own runs as Universal Assisted Generation (`tokenizer=` and `assistant_tokenizer=`: greedy
  through the text, sampling over the shared tokens), on a copy of the draft, since sampling cuts
  the assistant's output layer down to the shared tokens in place.
- `llama.cpp`: llama-cpp-python's own generation on the target's GGUF file
  (`specdeck.bench.llamacpp_baseline`), prefill timed apart as SpecDeck's is.

Hugging Face does not time prefill apart, so its prefill is measured as a generate() of one new
token, and its decoding rate is (new tokens - 1) / (total time - that prefill): the first token
comes out of the prefill forward in both loops.
"""

from __future__ import annotations

import copy
import time
import weakref
from dataclasses import dataclass, field

import torch

from specdeck.engine.config import DecodeConfig
from specdeck.engine.drafting.drafters import PromptLookupDrafter
from specdeck.engine.drafting.suffix import SuffixIndex
from specdeck.engine.events import RoundEvent, SummaryEvent, TokenEvent
from specdeck.engine.forward.hf_parts import generate_of
from specdeck.engine.forward.kvcache import synchronize
from specdeck.engine.loop.decoding import generate
from specdeck.engine.loop.detok import whole_text
from specdeck.engine.pair import DrafterKind, ModelPair
from specdeck.engine.stats import RemoteTotals, RoundTotals

SPECDECK_METHODS = ("plain", "speculative")
HF_METHODS = ("hf", "hf-assisted")
METHODS = SPECDECK_METHODS + HF_METHODS + ("llama.cpp",)


# match lengths shown together (`match_bucket`): a copy's rounds in `report.md`, `copy_bound`'s tallies
MATCH_BUCKETS = ((0, 0), (1, 1), (2, 2), (3, 3), (4, 5), (6, 8), (9, 15), (16, 10**9))


def match_bucket(match: int) -> tuple[int, str]:
    """The bucket of a copy's match length: its place in MATCH_BUCKETS and its label ("4-5", "16+")."""
    place, (low, high) = next((i, b) for i, b in enumerate(MATCH_BUCKETS) if b[0] <= match <= b[1])
    return place, str(low) if low == high else f"{low}+" if high == MATCH_BUCKETS[-1][1] else f"{low}-{high}"


def round_kind(event: RoundEvent) -> str:
    """What kind of round `event` was: a plain step, a model's drafts, or a copy, by where it was
    copied from and the bucket of its match's length (0: no match)."""
    if not event.drafted:
        return "plain step"
    if not event.source:
        return "model drafts"
    where = "this request" if event.source == "prompt" else "earlier texts"
    return f"copy of {where}, match {match_bucket(event.match_length)[1]}"


@dataclass
class Run:
    """One timed generation of one method on one prompt."""

    method: str
    k: int  # drafts per round; 0 for plain methods
    token_ids: list[int]  # the kept new tokens
    text: str
    decode_tokens: int  # tokens the decode time covers
    decode_s: float
    prefill_ms: float
    rounds: int  # target forwards after prefill
    drafted: int = 0
    accepted: int = 0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    shapes: dict[str, int] = field(default_factory=dict)  # rounds per shape ("K=2", "copy 3", "none")
    kinds: dict[str, RoundTotals] = field(default_factory=dict)  # each kind of round's totals (`round_kind`)
    remote: RemoteTotals = field(default_factory=RemoteTotals)  # a served target's request times
    plan: str = ""  # the auto schedule's account of what it weighed (`SummaryEvent.plan`)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0


def run_specdeck(
    pair: ModelPair, prompt_ids: list[int], config: DecodeConfig, speculative: bool, history: SuffixIndex | None = None
) -> Run:
    drafter = pair.make_drafter(history) if speculative else None
    token_ids: list[int] = []
    summary = None
    draft_ms = verify_ms = 0.0
    shapes: dict[str, int] = {}
    kinds: dict[str, RoundTotals] = {}
    remote = RemoteTotals()
    for event in generate(pair.target, prompt_ids, config, drafter):
        if isinstance(event, TokenEvent) and event.state.kept:
            token_ids.append(event.token_id)
        elif isinstance(event, RoundEvent):
            draft_ms += event.draft_ms
            verify_ms += event.verify_ms
            shapes[event.shape] = shapes.get(event.shape, 0) + 1
            kinds.setdefault(round_kind(event), RoundTotals()).count(event)
            remote.add(event)
        elif isinstance(event, SummaryEvent):
            summary = event
    if summary is None:
        raise RuntimeError("a decoding run ended without its summary")
    return Run(
        "speculative" if speculative else "plain",
        config.k if speculative else 0,
        token_ids,
        summary.text,
        summary.new_tokens,
        summary.decode_s,
        summary.prefill_ms,
        summary.rounds,
        summary.drafted,
        summary.accepted,
        draft_ms,
        verify_ms,
        shapes,
        kinds,
        remote,
        summary.plan,
    )


class _ForwardCounter:
    """Counts the target's forwards inside generate() and how many tokens each one scored. Under
    `assistant_early_exit` the target also drafts, with its config's layer count cut for the
    draft: those forwards are no verify, and are left out."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.lengths: list[int] = []
        self._config = getattr(model, "config", None)
        self._layers = getattr(self._config, "num_hidden_layers", None)
        self._handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs) -> None:
        if getattr(self._config, "num_hidden_layers", None) != self._layers:  # an early exit's draft
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            self.lengths.append(int(ids.shape[-1]))

    def close(self) -> None:
        self._handle.remove()


def _generation_config(pair: ModelPair, config: DecodeConfig, max_new_tokens: int, method: str):
    from transformers import GenerationConfig

    eos = sorted(pair.target.eos_ids)
    options: dict[str, object] = dict(
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        eos_token_id=eos or None,
        pad_token_id=eos[0] if eos else 0,
        do_sample=not config.greedy,
    )
    if not config.greedy:
        options.update(temperature=config.temperature, top_k=config.top_k or None, top_p=config.top_p)
    if method == "hf-assisted" and pair.drafter_kind is DrafterKind.PROMPT_LOOKUP:
        options.update(prompt_lookup_num_tokens=config.k, max_matching_ngram_size=PromptLookupDrafter().max_ngram)
    return GenerationConfig(**options)


def _hf_generate(
    pair: ModelPair, prompt_ids: list[int], config: DecodeConfig, method: str, max_new_tokens: int
) -> tuple[list[int], float]:
    """(new token ids, seconds) of one Hugging Face generate()."""
    target = pair.local_target
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=target.device)
    kwargs: dict[str, object] = {}
    if method == "hf-assisted" and pair.drafter_kind is DrafterKind.DRAFT_MODEL and pair.draft_model is not None:
        assistant = pair.draft_model.model
        if pair.cross_vocabulary:
            if assistant not in _ASSISTANT_COPIES:
                _ASSISTANT_COPIES[assistant] = copy.deepcopy(assistant)
            assistant = _ASSISTANT_COPIES[assistant]
            kwargs.update(tokenizer=target.tokenizer, assistant_tokenizer=pair.draft_model.tokenizer)
        assistant.generation_config.num_assistant_tokens = config.k
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        assistant.generation_config.assistant_confidence_threshold = 0.0
        kwargs["assistant_model"] = assistant
    if method == "hf-assisted" and pair.drafter_kind is DrafterKind.LAYER_SKIP and pair.layer_choice is not None:
        # the target is its own assistant, run through its first layers (`assistant_early_exit`)
        own = target.torch_model.generation_config
        own.num_assistant_tokens, own.num_assistant_tokens_schedule = config.k, "constant"
        own.assistant_confidence_threshold = 0.0
        kwargs["assistant_early_exit"] = pair.layer_choice.layers
    if not config.greedy:
        torch.manual_seed(config.seed)
    synchronize(target.device)
    started = time.perf_counter()
    out = generate_of(target.torch_model)(
        ids,
        attention_mask=torch.ones_like(ids),
        generation_config=_generation_config(pair, config, max_new_tokens, method),
        **kwargs,
    )
    synchronize(target.device)
    return out[0, len(prompt_ids) :].tolist(), time.perf_counter() - started


_ASSISTANT_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a draft -> the copy HF may change


def run_hf(pair: ModelPair, prompt_ids: list[int], config: DecodeConfig, method: str) -> Run:
    _, prefill_s = _hf_generate(pair, prompt_ids, config, method, max_new_tokens=1)
    counter = _ForwardCounter(pair.local_target.torch_model)
    try:
        token_ids, total_s = _hf_generate(pair, prompt_ids, config, method, config.max_new_tokens)
    finally:
        counter.close()
    token_ids = _cut_at_eos(token_ids, pair.target.eos_ids)
    rounds = len(counter.lengths)
    drafted = 0
    if method == "hf-assisted" and rounds:
        # the first forward scores the prompt and its drafts, every later one the newest kept token and its drafts
        drafted = counter.lengths[0] - len(prompt_ids) + sum(n - 1 for n in counter.lengths[1:])
    accepted = max(0, len(token_ids) - rounds) if drafted else 0
    text = whole_text(pair.target.tokenizer, token_ids)  # as a session's final text is made
    return Run(
        method,
        config.k if method == "hf-assisted" else 0,
        token_ids,
        text,
        max(0, len(token_ids) - 1),
        max(total_s - prefill_s, 1e-9),
        prefill_s * 1e3,
        rounds,
        drafted,
        accepted,
    )


def _cut_at_eos(token_ids: list[int], eos: frozenset[int]) -> list[int]:
    for i, token in enumerate(token_ids):
        if token in eos:
            return token_ids[: i + 1]
    return token_ids
