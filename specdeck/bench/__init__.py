"""`specdeck bench`: tokens/s of SpecDeck's plain and speculative decoding against Hugging Face's
`generate()` and its own speculative decoding, on the same prompts, in one alternating run."""

from specdeck.bench.methods import METHODS, Run
from specdeck.bench.prompts import BenchPrompt, read_prompts, sample_prompts
from specdeck.bench.runner import BenchSettings, Method, PromptResult, explain_mismatch, run_bench

__all__ = [
    "METHODS",
    "BenchPrompt",
    "BenchSettings",
    "Method",
    "PromptResult",
    "Run",
    "explain_mismatch",
    "read_prompts",
    "run_bench",
    "sample_prompts",
]
