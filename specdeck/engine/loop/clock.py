"""A round's clock (`Clock`): its draft and verify times and the session's decoding time, read after
a device synchronisation so that queued kernels count where they ran."""

from __future__ import annotations

import time

import torch

from specdeck.engine.forward.kvcache import synchronize


class Clock:
    """A round's times. A reading that ends device work first synchronises (`specdeck.engine.forward.kvcache`), so
    that queued kernels count where they ran; a round's start does not need to, since the last
    reading left nothing queued."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.decode_started: float | None = None
        self.round_started = self.verify_started = self.verify_ended = 0.0

    read = staticmethod(time.perf_counter)  # seconds; tests that need set costs replace it

    def now(self) -> float:
        synchronize(self.device)
        return self.read()

    def ms_since(self, started: float) -> float:
        return (self.now() - started) * 1e3

    def start_round(self) -> None:
        self.round_started = self.read()
        if self.decode_started is None:
            self.decode_started = self.round_started

    def drafted(self) -> None:
        self.verify_started = self.now()

    def verified(self) -> None:
        self.verify_ended = self.now()

    @property
    def draft_ms(self) -> float:
        return (self.verify_started - self.round_started) * 1e3

    @property
    def verify_ms(self) -> float:
        return (self.verify_ended - self.verify_started) * 1e3

    def round_ms(self) -> float:
        return (self.read() - self.round_started) * 1e3

    def decode_s(self) -> float:
        """Seconds since the first round started: decoding time so far, prefill excluded."""
        return self.read() - (self.decode_started or 0.0)
