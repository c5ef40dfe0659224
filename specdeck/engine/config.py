"""Settings of a decoding session, validated once so that the loop can trust them, and the check of
its prompt that front ends make before anything loads."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specdeck.engine.errors import SpecDeckError

SCHEDULES = ("auto", "constant", "heuristic")
SUFFIX_SCOPES = ("prompt", "session", "all")  # what a suffix drafter reads (`DecodeConfig.suffix_scope`)


MOST_K = 64  # the longest draft a session may ask for


@dataclass(frozen=True)
class DecodeConfig:
    """How to decode. `temperature == 0` is greedy; the other sampling knobs then do nothing.

    Draft length: `auto` (the default) chooses each round's K in [0, max_k], 0 meaning a plain
    step, and each copy's length in [1, lookup], to maximise expected tokens per second from the
    target's measured cost curve on this machine and the session's measured acceptance by depth
    (`specdeck.engine.planner.autotune`); `constant` drafts `k` tokens every round; `heuristic` starts at `k` and
    moves to K+2 after a fully accepted round and K-1 otherwise, within [1, max_k]. With
    `confidence_threshold > 0` the drafter also stops early once its top probability falls
    below it.

    With `lookup > 0` a round first tries prompt lookup: when the text so far ends with two or
    more tokens that occurred earlier (in the prompt or the answer), it proposes up to `lookup`
    tokens copied from what followed them, and asks the drafter only when nothing repeats (or,
    under `auto`, when the drafter's measured rate beats the copies'). Copies cost no model call,
    so summaries, quotes and edited code gain; q is one-hot on each copied token, which keeps
    rejection sampling exact.

    A suffix drafter (and the hybrid's copies) drafts from the texts `suffix_scope` names:
    `prompt`, this request's own text (prompt and answer so far); `session`, also the answers
    written since SpecDeck started and the target's own texts (its answers to requests SpecDeck
    composes, `specdeck suffix-texts`; the built-in target's ship with SpecDeck); `all`, also those
    of past sessions, which it keeps in the cache folder (`specdeck.engine.drafting.past_sessions`) and adds each new
    answer to.
    """

    k: int = 1  # the draft length of the constant schedule, and where the heuristic one starts
    schedule: str = "auto"
    max_k: int = 16
    confidence_threshold: float = 0.0
    lookup: int = 8  # the most tokens copied per round where the text repeats, 0 = off
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 128
    stop_strings: tuple[str, ...] = field(default_factory=tuple)
    truncate_prompt: bool = (
        False  # a prompt too long for the context: keep its last part, not refuse (`specdeck.engine.context`)
    )
    suffix_scope: str = "session"

    def __post_init__(self) -> None:
        if self.k < 1:
            raise SpecDeckError(
                f"K must be at least 1 (got {self.k}): it is how many tokens the drafter proposes per round."
            )
        if self.max_k < self.k:
            raise SpecDeckError(
                f"K can be at most {self.max_k} (got {self.k}): a round keeps drafts only up to the first one the "
                "target rejects, so even a drafter right 9 times in 10 keeps about 10 a round, while every "
                "extra draft costs a drafter step and widens the target's forward."
            )
        if self.schedule not in SCHEDULES:
            raise SpecDeckError(
                f"Unknown draft-length schedule {self.schedule!r}: choose one of {', '.join(SCHEDULES)}."
            )
        if self.suffix_scope not in SUFFIX_SCOPES:
            raise SpecDeckError(
                f"Unknown suffix scope {self.suffix_scope!r}: choose prompt (this request's text), "
                "session (also earlier answers since SpecDeck started) or all (also past sessions')."
            )
        if self.lookup < 0:
            raise SpecDeckError(f"Lookup must be 0 (off) or the most tokens to copy per round (got {self.lookup}).")
        if not 0.0 <= self.confidence_threshold < 1.0:
            raise SpecDeckError(f"The confidence threshold must be in [0, 1) (got {self.confidence_threshold}).")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise SpecDeckError(f"Temperature must be 0 (greedy) or a positive number (got {self.temperature}).")
        if self.top_k < 0:
            raise SpecDeckError(f"top-k must be 0 (off) or positive (got {self.top_k}).")
        if not 0.0 < self.top_p <= 1.0:
            raise SpecDeckError(f"top-p must be in (0, 1] (got {self.top_p}); 1 turns it off.")
        if self.max_new_tokens < 1:
            raise SpecDeckError(f"Max new tokens must be at least 1 (got {self.max_new_tokens}).")
        if self.max_k > MOST_K:
            raise SpecDeckError(
                f"The longest draft can be at most {MOST_K} tokens (got {self.max_k}): each costs a drafter step "
                "and widens the target's forward, while a round keeps drafts only up to the first refused one."
            )
        if any(not stop for stop in self.stop_strings):
            raise SpecDeckError("A stop string must not be empty (it would match before the first token): drop it.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def check_prompt(text: str) -> str:
    """`text`, or a `SpecDeckError` if there is nothing in it to continue or answer (front ends ask
    before loading models; `encode_prompt` asks again)."""
    if not text.strip():
        raise SpecDeckError("The prompt is empty: type something for the model to continue or answer.")
    return text
