"""What a benchmark run times: its methods (`Method`: plain, speculative per drafter, K and lookup,
the baselines) and its settings (`BenchSettings`), checked as they are made.

Plain Python, no torch: the Benchmark tab and the command line's parser read these before the
engine has imported; `specdeck.bench.runner` times them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from specdeck.engine.config import DecodeConfig
from specdeck.engine.errors import SpecDeckError

if TYPE_CHECKING:
    from specdeck.engine.pair import ModelPair

__all__ = ["AUTO_K", "BASELINES", "OTHER_BASELINES", "BenchSettings", "Method"]

AUTO_K = 0  # a speculative method's K when the auto schedule chooses it each round
BASELINES = ("plain", "hf", "hf-assisted")  # what speculative decoding is compared with
OTHER_BASELINES = ("llama.cpp",)  # asked for by name: llama-cpp-python's own generation of a .gguf target


class Method(NamedTuple):
    """One timed way to decode; speculative and hf-assisted name their K and their drafter, and
    speculative how many tokens prompt lookup may copy first (`DecodeConfig.lookup`)."""

    name: str  # plain, speculative, repeat (speculative with the prompt's own plain answer as history), hf, hf-assisted
    k: int = 0  # drafts per round; 0 for plain and hf, AUTO_K (0) for speculative under the auto schedule
    drafter: str = ""  # the pair's drafter_description, e.g. "feature head smollm2-135m-head"
    lookup: int = 0
    copier: str = "prompt lookup"  # what copies up to `lookup` tokens first (a hybrid's: suffix)

    @property
    def shown_drafter(self) -> str:
        """The drafter as reports name it: with its copier first where that ran."""
        return f"{self.drafter} + {self.copier} {self.lookup}" if self.lookup else self.drafter

    @property
    def speculative(self) -> bool:
        """Whether it is SpecDeck's speculative loop (the `repeat` scenario is too)."""
        return self.name in ("speculative", "repeat")

    @property
    def auto(self) -> bool:
        return self.speculative and self.k == AUTO_K

    @property
    def shown_k(self) -> str:
        """K as reports write it: a number, "auto", or "" for methods without drafts."""
        return "auto" if self.auto else (str(self.k) if self.k else "")

    @property
    def label(self) -> str:
        text = f"{self.name} K={self.shown_k}" if self.shown_k else self.name
        return f"{text} ({self.shown_drafter})" if self.drafter else text


@dataclass(frozen=True)
class BenchSettings:
    ks: tuple[int, ...] = (AUTO_K,)
    lookups: tuple[int, ...] = (DecodeConfig.lookup,)  # prompt lookup first per speculative method, 0: off
    baselines: tuple[str, ...] = BASELINES
    repeats: int = 3
    decode: DecodeConfig = field(default_factory=DecodeConfig)  # K and lookup are each method's own
    repeat_scenario: bool = False  # also time drafters that read earlier texts regenerating each prompt

    def check_remote(self) -> None:
        """Refuse what a served target cannot run: the auto schedule, which plans from the target's
        costs measured on this machine, and sampling (`specdeck.engine.remote.remote_target.require_greedy`)."""
        if AUTO_K in self.ks:
            raise SpecDeckError(
                "A served target's forward costs are not measured here, so the auto schedule "
                "cannot plan its rounds: give draft lengths with --k (e.g. --k 2,4)."
            )
        if not self.decode.greedy:
            raise SpecDeckError(
                "A remote target decodes greedily only (servers return top-k log-probabilities, not "
                "the distribution sampling needs): leave --temperature at 0."
            )

    def __post_init__(self) -> None:
        unknown = [b for b in self.baselines if b not in BASELINES + OTHER_BASELINES]
        if unknown:
            raise SpecDeckError(
                f"Unknown baseline {', '.join(unknown)}: choose from {', '.join(BASELINES + OTHER_BASELINES)}."
            )
        if not self.ks or min(self.ks) < AUTO_K:
            raise SpecDeckError("--k takes positive draft lengths or auto, e.g. 4 or auto,1,2,4.")
        if not self.lookups or min(self.lookups) < 0:
            raise SpecDeckError("--lookup takes tokens to copy per round, 0 for off, e.g. 0,2.")
        if self.repeats < 1:
            raise SpecDeckError(f"--repeats must be at least 1 (got {self.repeats}).")

    def methods(self, pairs: Sequence[ModelPair]) -> list[Method]:
        """Methods in their base order; plain decoding always runs: speedups refer to it. Each pair's
        drafter gets speculative per K and lookup (prompt lookup itself only without), and
        hf-assisted per K where Hugging Face has that drafter."""
        methods = [Method("plain")]
        reads_history = {pair.drafter_description: pair.reads_history for pair in pairs}
        for pair in pairs:
            lookups = (0,) if pair.copies_text else self.lookups
            copier = pair.drafter_kind.record.copier if pair.drafter_kind else "prompt lookup"
            methods += [
                Method("speculative", k, pair.drafter_description, lookup, copier)
                for k in self.ks
                for lookup in lookups
            ]
        if self.repeat_scenario:
            methods += [m._replace(name="repeat") for m in methods[1:] if reads_history[m.drafter]]
        if "hf" in self.baselines and not pairs[0].remote:  # Hugging Face needs the target at hand
            methods.append(Method("hf"))
        if "hf-assisted" in self.baselines:
            methods += [
                Method("hf-assisted", k, pair.drafter_description)
                for pair in pairs
                if pair.hugging_face_runs
                for k in self.ks
                if k != AUTO_K
            ]
        if "llama.cpp" in self.baselines:
            methods.append(Method("llama.cpp"))
        return methods
