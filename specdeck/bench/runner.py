"""One benchmark run: every method on every prompt, in an order that alternates methods, so that
machine noise (other processes, thermal limits) hits all of them alike.

Several drafters can share one run: they share one loaded target (one `ModelPair` each), and
speculative and hf-assisted run per drafter and K against the same plain and hf runs.

A record's turns run as one conversation (as Spec-Bench asks MT-Bench's second turns): each later
turn is asked after the earlier turns and their plain answers, the same context for every method,
and is timed as a prompt of its own (`PromptResult.turn`).

A suffix drafter drafts from the earlier prompts' texts, never from a run of the same prompt
(which would time copying the answer): each prompt's runs read a history of every earlier prompt
and its first speculative answer, which joins the history only once all of the prompt's runs ended.
Regenerating a prompt is timed apart, as the labelled `repeat` scenario (`BenchSettings.repeat_scenario`):
the same drafter with only this prompt and its plain answer as history, run after the other methods.

Per prompt and repeat the method list is rotated by one more place, so no method always runs
first or right after another. Warm-up runs (one short generation per method) are left out of
every figure. Greedy runs check that each method's tokens equal plain decoding's; a prompt where
they do not is flagged with the reason (`explain_mismatch`).
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from specdeck.bench.llamacpp_baseline import OTHER_ROUNDING, check_baseline, run_llama_cpp
from specdeck.bench.methods import HF_METHODS, SPECDECK_METHODS, Run, run_hf, run_specdeck
from specdeck.bench.prompts import BenchPrompt
from specdeck.bench.settings import BenchSettings, Method
from specdeck.engine.config import DecodeConfig
from specdeck.engine.drafting.suffix import SuffixIndex
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward.kvcache import CachedModel
from specdeck.engine.forward.lean_weights import rows_in_8_bits
from specdeck.engine.loading.models import encode_conversation, encode_prompt
from specdeck.engine.pair import ModelPair

Progress = Callable[[int, int, str], None]  # (runs done, runs in all, what runs now)
EIGHT_BIT_ROWS = (
    "Hugging Face's forward multiplies the float32 weights, SpecDeck's target the GGUF file's blocks "
    "with its rows in 8 bits (as llama.cpp does; SPECDECK_GGUF_BLOCKS=float32 keeps float32 rows): "
    "another arithmetic, not a decoding bug"
)


@dataclass
class PromptResult:
    """Every method's runs on one prompt; identity with plain decoding is judged on the first run."""

    prompt: BenchPrompt
    prompt_tokens: int
    runs: dict[Method, list[Run]] = field(default_factory=dict)
    mismatch: dict[Method, str] = field(default_factory=dict)  # reason, for greedy runs that differ
    turn: int = 1  # which of the record's turns, asked after the earlier ones and their answers

    def median_run(self, method: Method) -> Run:
        """The run with the median decode time (figures of one real run, not a blend)."""
        runs = sorted(self.runs[method], key=lambda r: r.decode_s)
        return runs[(len(runs) - 1) // 2]

    def median_prefill_ms(self, method: Method) -> float:
        return statistics.median(r.prefill_ms for r in self.runs[method])


def _config_for(settings: BenchSettings, method: Method, max_new_tokens: int | None = None) -> DecodeConfig:
    k = method.k or settings.decode.k
    schedule = "auto" if method.auto else "constant"
    return replace(
        settings.decode,
        k=k,
        lookup=method.lookup,
        schedule=schedule,
        confidence_threshold=0.0,
        max_new_tokens=max_new_tokens or settings.decode.max_new_tokens,
    )


def run_method(
    pair: ModelPair, prompt_ids: list[int], config: DecodeConfig, method: str, history: SuffixIndex | None = None
) -> Run:
    """One run; `history`: the earlier texts a suffix drafter reads (and leaves as they are)."""
    if method in SPECDECK_METHODS:
        return run_specdeck(pair, prompt_ids, config, speculative=method == "speculative", history=history)
    if method == "llama.cpp":
        return run_llama_cpp(pair, prompt_ids, config)
    return run_hf(pair, prompt_ids, config, method)


def run_bench(
    pairs: Sequence[ModelPair],
    prompts: Sequence[BenchPrompt],
    settings: BenchSettings,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> list[PromptResult]:
    """Every method of `settings.methods(pairs)` on every prompt; the pairs share one target.

    Setting `cancel` stops before the next run; the prompts whose runs all finished are returned."""
    if not pairs or any(pair.drafter_kind is None for pair in pairs):
        raise SpecDeckError("The benchmark compares speculative decoding with plain decoding: it needs a drafter.")
    if "llama.cpp" in settings.baselines:
        check_baseline(pairs[0])
    pair_of = {pair.drafter_description: pair for pair in pairs}
    if len(pair_of) < len(pairs):
        raise SpecDeckError("Two drafters of the benchmark have the same name: name each drafter once.")

    histories = {pair.drafter_description: SuffixIndex() for pair in pairs if pair.reads_history}

    def run(
        method: Method, prompt_ids: list[int], max_new_tokens: int | None = None, history: SuffixIndex | None = None
    ) -> Run:
        pair = pair_of.get(method.drafter, pairs[0])  # plain and hf use the (shared) target alone
        return run_method(
            pair,
            prompt_ids,
            _config_for(settings, method, max_new_tokens),
            "speculative" if method.speculative else method.name,
            history if history is not None else histories.get(method.drafter),
        )

    methods = settings.methods(pairs)
    timed = [m for m in methods if m.name != "repeat"]  # rotated; the repeat scenario runs after them
    repeat_methods = [m for m in methods if m.name == "repeat"]
    tokenizer = pairs[0].target.tokenizer
    total = sum(len(p.turns) for p in prompts) * settings.repeats * len(methods)
    done = 0
    for method in methods:  # warm-up: kernels, allocator and HF's generation setup, untimed
        if cancel is not None and cancel.is_set():
            return []
        if progress:
            progress(done, total, f"warm-up {method.label}")
        run(
            method,
            encode_prompt(tokenizer, prompts[0].text, chat=prompts[0].chat),
            max_new_tokens=8,
            history=SuffixIndex(),
        )
    results: list[PromptResult] = []
    for index, prompt in enumerate(prompts):
        answers: list[str] = []  # plain decoding's answers to the record's earlier turns
        for turn in range(1, len(prompt.turns) + 1):
            prompt_ids = encode_conversation(tokenizer, list(prompt.turns[:turn]), answers, prompt.chat)
            result = PromptResult(prompt, len(prompt_ids), turn=turn)
            for repeat in range(settings.repeats):
                shift = (index + repeat) % len(timed)
                for method in timed[shift:] + timed[:shift] + repeat_methods:
                    if cancel is not None and cancel.is_set():
                        return results  # a prompt with some methods missing would skew every figure
                    if progress:
                        progress(
                            done, total, f"{prompt.category} {prompt.name}{_turn_label(prompt, turn)}: {method.label}"
                        )
                    own = None
                    if method.name == "repeat":  # this prompt asked again: its own plain answer is the history
                        own = SuffixIndex()
                        own.extend(prompt_ids + result.runs[Method("plain")][0].token_ids)
                        own.separate()
                    result.runs.setdefault(method, []).append(run(method, prompt_ids, history=own))
                    done += 1
            recorded = set()
            for method in methods:  # each suffix drafter's first answer to this prompt joins its history
                if method.name == "speculative" and method.drafter in histories and method.drafter not in recorded:
                    recorded.add(method.drafter)
                    histories[method.drafter].extend(prompt_ids + result.runs[method][0].token_ids)
                    histories[method.drafter].separate()
            plain = result.runs[Method("plain")][0]
            eight_bits = not pairs[0].remote and rows_in_8_bits(pairs[0].local_target.model)
            if settings.decode.greedy:
                for method, runs in result.runs.items():
                    if runs[0].token_ids == plain.token_ids:
                        continue
                    if method.name == "llama.cpp":
                        result.mismatch[method] = OTHER_ROUNDING.format(
                            backend=(
                                "the file's blocks on torch, its rows in 8 bits"
                                if eight_bits
                                else "the file's weights dequantized on torch"
                            )
                            if pairs[0].target.backend == "torch"
                            else "llama.cpp with flash attention on an 8-bit KV cache"
                        )
                    elif method.name in HF_METHODS and eight_bits:
                        result.mismatch[method] = EIGHT_BIT_ROWS
                    else:
                        result.mismatch[method] = explain_mismatch(
                            pairs[0], prompt_ids, plain.token_ids, runs[0].token_ids
                        )
            answers.append(plain.text)
            results.append(result)
    if progress:
        progress(done, total, "done")
    return results


def _turn_label(prompt: BenchPrompt, turn: int) -> str:
    return f" turn {turn}" if len(prompt.turns) > 1 else ""


def explain_mismatch(pair: ModelPair, prompt_ids: list[int], plain: list[int], other: list[int]) -> str:
    """Why a greedy method's tokens differ from plain decoding's, judged at the first difference.

    Batched verification and one-token decoding add the same numbers in another order, so where
    the target's top two logits are within rounding of each other either choice is the argmax
    (common in float16/bfloat16, rare in float32). A clear gap means a real bug.
    """
    decode = pair.target.tokenizer.decode
    at = next((i for i, (a, b) in enumerate(zip(plain, other)) if a != b), min(len(plain), len(other)))
    if at == min(len(plain), len(other)):
        shorter = "plain" if len(plain) < len(other) else "this method"
        return f"{shorter} stopped after {at} tokens while the other went on (same tokens up to there)"
    if pair.remote:
        return (
            f"token {at}: plain chose {decode([plain[at]])!r}, this method {decode([other[at]])!r} (a served "
            "target: its logits are not at hand to judge a near-tie)"
        )
    logits = CachedModel(pair.local_target.model).forward(prompt_ids + plain[:at], last_only=True)[-1].float()
    gap = float(logits[plain[at]] - logits[other[at]])
    scale = float(logits.abs().max())
    dtype = str(pair.target.dtype).removeprefix("torch.")
    eps = torch.finfo(pair.target.dtype).eps
    words = f"token {at}: plain chose {decode([plain[at]])!r}, this method {decode([other[at]])!r}"
    if abs(gap) <= 32 * eps * max(scale, 1.0):
        return f"near-tie at {words}; their logits differ by {gap:.2g}, within {dtype} rounding (not a bug)"
    return f"{words}; their logits differ by {gap:.3g}, more than {dtype} rounding: a decoding bug"
