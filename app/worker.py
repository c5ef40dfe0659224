"""The model thread: one long-lived `QThread` whose worker owns the loaded models and runs sessions.

Threads: `ModelWorker` lives in the model thread (moveToThread) and is the only code that touches
torch. `ModelHost` lives in the GUI thread; it sends requests to the worker through queued signals
and re-emits the worker's reports only for the current load or session, so a stopped or superseded
session's late events never reach the views. A benchmark (`engine.bench`) runs there too, on the
resident pair, like a long session: progress comes back as it goes, its files come back at the end.

Events cross in batches: the worker collects a session's events and emits one tuple at most every
`BATCH_INTERVAL_S` (and at the end), so the GUI thread handles ~40 signals a second however fast
tokens come, and every event arrives exactly once, in order.
"""

from __future__ import annotations

import asyncio
import gc
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, QThread, Signal, Slot

from engine.bench.prompts import BenchPrompt
from engine.bench.runner import BenchSettings
from engine.bench.service import report_context, run_and_write
from engine.config import DecodeConfig
from engine.errors import SpecDeckError
from engine.events import SummaryEvent
from engine.memory import give_back, is_out_of_memory, out_of_memory_message
from engine.pair import ModelPair, PairSpec
from engine.session import add_drafters, load_pair, run_session

BATCH_INTERVAL_S = 0.025


def freeze_long_lived_objects() -> None:
    """Collect garbage once, then leave every object alive now out of later collections (gc.freeze).

    A full collection scans every tracked object while holding the GIL. With torch, transformers,
    Qt and a loaded model that is ~400k objects and 150-400 ms in which the GUI thread cannot run,
    and a fast session's events trigger one every few seconds, whichever thread allocates. The
    objects alive after start-up or a load (modules, classes, widgets, the models) live as long as
    the process or the pair, so they need no scanning. Unfreezing first lets the collection free a
    replaced pair's reference cycles."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


class LoadCancelled(Exception):
    """The user cancelled loading; raised from the progress callback at the next stage."""


class BenchCancelled(Exception):
    """The user cancelled a benchmark; raised from the harness's progress callback before its next run."""


@dataclass(frozen=True)
class LoadRequest:
    spec: PairSpec
    load_id: int = field(default=0, compare=False)
    cancel: threading.Event = field(default_factory=threading.Event, compare=False)


@dataclass(frozen=True)
class PairInfo:
    """What the GUI may know about the resident pair (never the models themselves)."""

    description: str
    target: str
    draft: str | None
    drafter: str | None
    device: str
    dtype: str


@dataclass(frozen=True)
class SessionRequest:
    prompt: str
    config: DecodeConfig
    chat: bool = True
    plain: bool = False
    session_id: int = 0
    cancel: threading.Event = field(default_factory=threading.Event, compare=False)


@dataclass(frozen=True)
class BenchRequest:
    prompts: tuple[BenchPrompt, ...]
    settings: BenchSettings
    source: str  # the prompt file, as the report names it
    command: str  # the `specdeck bench` command line that reproduces the run
    drafters: tuple[PairSpec, ...] = ()  # more drafters of the resident target, timed beside its own
    bench_id: int = 0
    cancel: threading.Event = field(default_factory=threading.Event, compare=False)


@dataclass(frozen=True)
class BenchOutcome:
    """A finished benchmark: summary.csv's rows, and every file `specdeck bench` writes, by name."""

    summary: list[dict]
    files: dict[str, bytes]


def describe(pair: ModelPair) -> PairInfo:
    return PairInfo(pair.description, pair.target.name, pair.drafter_model,
                    pair.drafter_kind and pair.drafter_kind.value, str(pair.target.device),
                    str(pair.target.dtype).removeprefix("torch."))


def error_message(error: BaseException) -> str:
    """A SpecDeckError's message as-is; running out of memory as what to try instead; anything else
    with its type, since it is a bug or a bad model."""
    if isinstance(error, SpecDeckError):
        return str(error)
    if is_out_of_memory(error):
        return out_of_memory_message(error)
    detail = traceback.format_exception_only(type(error), error)[-1].strip()
    return f"Unexpected error: {detail}"


class ModelWorker(QObject):
    """Lives in the model thread. Owns the `ModelPair`; every slot catches every exception."""

    load_progress = Signal(int, str)  # load id, stage
    loaded = Signal(int, object)  # load id, PairInfo
    load_failed = Signal(int, str, bool)  # load id, message, cancelled
    events = Signal(int, tuple)  # session id, events in order
    session_failed = Signal(int, str)  # session id, message
    bench_progress = Signal(int, int, int, str)  # bench id, runs done, runs in all, what runs now
    bench_finished = Signal(int, object)  # bench id, BenchOutcome
    bench_failed = Signal(int, str, bool)  # bench id, message, cancelled

    def __init__(self, session_fn: Callable = run_session, load_fn: Callable = load_pair) -> None:
        super().__init__()
        self._session_fn = session_fn
        self._load_fn = load_fn
        self._pair: ModelPair | None = None

    @Slot(object)
    def load(self, request: LoadRequest) -> None:
        def progress(stage: str) -> None:
            if request.cancel.is_set():
                raise LoadCancelled
            self.load_progress.emit(request.load_id, stage)

        try:
            progress("Starting")
            pair = self._load_fn(request.spec, progress=progress)
            if request.cancel.is_set():
                raise LoadCancelled
        except LoadCancelled:
            self.load_failed.emit(request.load_id, "Loading was cancelled.", True)
            return
        except BaseException as error:  # noqa: BLE001 - every failure becomes a message, never a dead thread
            message = error_message(error)
        else:
            self._pair = pair  # the previous pair is released only once the new one loaded
            freeze_long_lived_objects()
            give_back(collect=False)  # the previous pair's memory, now collected
            self.loaded.emit(request.load_id, describe(pair))
            return
        give_back()  # whatever the failed load had allocated
        self.load_failed.emit(request.load_id, message, False)

    @Slot(object)
    def run(self, request: SessionRequest) -> None:
        if self._pair is None:
            self.session_failed.emit(request.session_id, "No models are loaded: press Load first.")
            return
        batch: list = []
        last_emit = time.perf_counter()
        try:
            for event in self._session_fn(self._pair, request.prompt, request.config, chat=request.chat,
                                          plain=request.plain, cancel=request.cancel):
                batch.append(event)
                now = time.perf_counter()
                if now - last_emit >= BATCH_INTERVAL_S or isinstance(event, SummaryEvent):
                    self.events.emit(request.session_id, tuple(batch))
                    batch = []
                    last_emit = now
        except BaseException as error:  # noqa: BLE001
            if batch:
                self.events.emit(request.session_id, tuple(batch))
            message = error_message(error)
        else:
            if batch:
                self.events.emit(request.session_id, tuple(batch))
            return
        # the failed session's caches went with its traceback: give them back (after running out
        # of memory, so that the next session has it)
        give_back()
        self.session_failed.emit(request.session_id, message)

    @Slot(object)
    def bench(self, request: BenchRequest) -> None:
        """Run the benchmark harness and write its files into a temporary folder, then send them back.

        The harness reports progress once before each timed generation, so its signals are as rare
        as generations; the cancel check there stops it before the next one."""
        if self._pair is None:
            self.bench_failed.emit(request.bench_id, "No models are loaded: press Load first.", False)
            return

        def progress(done: int, total: int, label: str) -> None:
            if request.cancel.is_set():
                raise BenchCancelled
            self.bench_progress.emit(request.bench_id, done, total, label)

        try:
            pairs = [self._pair]
            if request.drafters:  # loaded for this benchmark only, on the resident target
                progress(0, 0, "Loading the other drafters…")
                pairs += add_drafters(self._pair, request.drafters, progress=lambda stage: progress(0, 0, stage))
            context = report_context(pairs, request.source, request.command)
            with tempfile.TemporaryDirectory(prefix="specdeck-bench-") as folder:
                summary = run_and_write(pairs, list(request.prompts), request.settings, Path(folder), context,
                                        progress=progress)
                files = {path.name: path.read_bytes() for path in sorted(Path(folder).iterdir())}
        except BenchCancelled:
            self.bench_failed.emit(request.bench_id, "The benchmark was cancelled.", True)
            return
        except BaseException as error:  # noqa: BLE001
            self.bench_failed.emit(request.bench_id, error_message(error), False)
            return
        self.bench_finished.emit(request.bench_id, BenchOutcome(summary, files))


class ModelHost(QObject):
    """Lives in the GUI thread: starts the model thread, sends it requests, filters its reports.

    `load` and `run` return asyncio futures (qasync's loop) that resolve when the load or the
    session ends, so orchestration reads as straight-line `await`s.
    """

    load_progress = Signal(str)
    events = Signal(int, tuple)  # session id, batch: only the current session's
    session_finished = Signal(int, object)  # session id, SummaryEvent
    session_failed = Signal(int, str)
    bench_progress = Signal(int, int, str)  # runs done, runs in all, what runs now: the current benchmark's
    _request_load = Signal(object)
    _request_run = Signal(object)
    _request_bench = Signal(object)

    def __init__(self, parent: QObject | None = None, session_fn: Callable = run_session,
                 load_fn: Callable = load_pair) -> None:
        super().__init__(parent)
        self._thread = QThread()
        self._thread.setObjectName("specdeck-models")
        self._worker = ModelWorker(session_fn, load_fn)
        self._worker.moveToThread(self._thread)
        self._thread.finished.connect(self._worker.deleteLater)
        self._request_load.connect(self._worker.load)
        self._request_run.connect(self._worker.run)
        self._request_bench.connect(self._worker.bench)
        self._worker.load_progress.connect(self._on_load_progress)
        self._worker.loaded.connect(self._on_loaded)
        self._worker.load_failed.connect(self._on_load_failed)
        self._worker.events.connect(self._on_events)
        self._worker.session_failed.connect(self._on_session_failed)
        self._worker.bench_progress.connect(self._on_bench_progress)
        self._worker.bench_finished.connect(self._on_bench_finished)
        self._worker.bench_failed.connect(self._on_bench_failed)
        self._thread.start()
        self._load: LoadRequest | None = None
        self._load_future: asyncio.Future | None = None
        self._session: SessionRequest | None = None
        self._session_future: asyncio.Future | None = None
        self._bench: BenchRequest | None = None
        self._bench_future: asyncio.Future | None = None
        self._next_id = 0
        self.pair: PairInfo | None = None

    # requests ---------------------------------------------------------------------------------

    def load(self, spec: PairSpec) -> asyncio.Future:
        """Load the pair `spec` names in the model thread; the future gives its `PairInfo` or raises
        SpecDeckError."""
        self.cancel_load()
        self._next_id += 1
        self._load = LoadRequest(spec, self._next_id)
        self._load_future = asyncio.get_event_loop().create_future()
        self._request_load.emit(self._load)
        return self._load_future

    def cancel_load(self) -> None:
        """Stop waiting for the current load; the model thread drops it at its next stage."""
        if self._load is not None:
            self._load.cancel.set()
            self._resolve(self._load_future, error=LoadCancelled("Loading was cancelled."))
            self._load = None

    def run(self, prompt: str, config: DecodeConfig, chat: bool = True, plain: bool = False) -> tuple[int, asyncio.Future]:
        """Start a session (after any earlier one has stopped); returns its id and a future of its
        `SummaryEvent`, which raises SpecDeckError if the session failed."""
        self.stop()
        if self._session_future is not None and not self._session_future.done():
            self._session_future.cancel()
        self._next_id += 1
        self._session = SessionRequest(prompt, config, chat, plain, self._next_id)
        self._session_future = asyncio.get_event_loop().create_future()
        self._request_run.emit(self._session)
        return self._session.session_id, self._session_future

    def stop(self) -> None:
        """Ask the current session to stop at its next round; its events up to there still arrive."""
        if self._session is not None:
            self._session.cancel.set()

    def bench(self, prompts: list[BenchPrompt], settings: BenchSettings, source: str, command: str,
              drafters: tuple[PairSpec, ...] = ()) -> asyncio.Future:
        """Benchmark the resident pair in the model thread, with `drafters` of its target beside its own
        drafter; the future gives a `BenchOutcome`, or raises SpecDeckError if the harness failed, or
        BenchCancelled."""
        self.cancel_bench()
        self._next_id += 1
        self._bench = BenchRequest(tuple(prompts), settings, source, command, tuple(drafters), self._next_id)
        self._bench_future = asyncio.get_event_loop().create_future()
        self._request_bench.emit(self._bench)
        return self._bench_future

    def cancel_bench(self) -> None:
        """Stop waiting for the current benchmark; the model thread drops it before its next generation,
        and anything sent to the model thread after this runs once that generation is over."""
        if self._bench is not None:
            self._bench.cancel.set()
            self._resolve(self._bench_future, error=BenchCancelled("The benchmark was cancelled."))
            self._bench = None

    @property
    def busy(self) -> bool:
        return self._session is not None or self._load is not None or self._bench is not None

    def shutdown(self) -> None:
        """Stop whatever runs, end the model thread and wait for it (window closing)."""
        self.stop()
        for request in (self._load, self._bench):
            if request is not None:
                request.cancel.set()
        for future in (self._load_future, self._session_future, self._bench_future):
            if future is not None and not future.done():
                future.cancel()
        self._session = self._load = self._bench = None
        self._thread.quit()
        self._thread.wait()

    @property
    def thread_running(self) -> bool:
        return self._thread.isRunning()

    # reports from the model thread ------------------------------------------------------------------

    @staticmethod
    def _resolve(future: asyncio.Future | None, result=None, error: BaseException | None = None) -> None:
        if future is None or future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    @Slot(int, str)
    def _on_load_progress(self, load_id: int, stage: str) -> None:
        if self._load is not None and load_id == self._load.load_id:
            self.load_progress.emit(stage)

    @Slot(int, object)
    def _on_loaded(self, load_id: int, info: PairInfo) -> None:
        self.pair = info  # the worker holds this pair now, even if nobody waits for it any more
        if self._load is not None and load_id == self._load.load_id:
            self._load = None
            self._resolve(self._load_future, info)

    @Slot(int, str, bool)
    def _on_load_failed(self, load_id: int, message: str, cancelled: bool) -> None:
        if self._load is not None and load_id == self._load.load_id:
            self._load = None
            self._resolve(self._load_future, error=LoadCancelled(message) if cancelled else SpecDeckError(message))

    @Slot(int, tuple)
    def _on_events(self, session_id: int, batch: tuple) -> None:
        if self._session is None or session_id != self._session.session_id:
            return  # a stopped session's late events
        self.events.emit(session_id, batch)
        if isinstance(batch[-1], SummaryEvent):
            self._session = None
            self.session_finished.emit(session_id, batch[-1])
            self._resolve(self._session_future, batch[-1])

    @Slot(int, str)
    def _on_session_failed(self, session_id: int, message: str) -> None:
        if self._session is None or session_id != self._session.session_id:
            return
        self._session = None
        self.session_failed.emit(session_id, message)
        self._resolve(self._session_future, error=SpecDeckError(message))

    @Slot(int, int, int, str)
    def _on_bench_progress(self, bench_id: int, done: int, total: int, label: str) -> None:
        if self._bench is not None and bench_id == self._bench.bench_id:
            self.bench_progress.emit(done, total, label)

    @Slot(int, object)
    def _on_bench_finished(self, bench_id: int, outcome: BenchOutcome) -> None:
        if self._bench is not None and bench_id == self._bench.bench_id:
            self._bench = None
            self._resolve(self._bench_future, outcome)

    @Slot(int, str, bool)
    def _on_bench_failed(self, bench_id: int, message: str, cancelled: bool) -> None:
        if self._bench is not None and bench_id == self._bench.bench_id:
            self._bench = None
            self._resolve(self._bench_future, error=BenchCancelled(message) if cancelled else SpecDeckError(message))
