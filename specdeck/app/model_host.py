"""The GUI thread's side of the model thread: `ModelHost` starts the thread with its `ModelWorker`
(`worker`), sends it requests and passes on only the current request's reports.

Apart from the worker because each module then holds the code of one thread: this one runs in the
GUI thread and never touches torch; the controller awaits the futures it returns. `start_engine`
has the model thread import the engine while the window paints (`worker`); a load asked for
before then says it waits for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from PySide6.QtCore import QObject, QThread, Signal, Slot

from specdeck.app.worker import BenchRequest, LoadRequest, ModelWorker, PairInfo, Request, SessionRequest
from specdeck.bench.prompts import BenchPrompt
from specdeck.bench.settings import BenchSettings
from specdeck.engine.config import DecodeConfig
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.pair_spec import PairSpec

STARTING = "Starting the engine (importing torch and transformers)…"


class ModelHost(QObject):
    """Lives in the GUI thread: starts the model thread, sends it requests, filters its reports.

    Every request goes one way: `_submit` supersedes the current request of its kind, sends it, and
    returns an asyncio future (qasync's loop) that the request's end resolves, so orchestration
    reads as straight-line `await`s. Reports of a superseded request are dropped here.
    """

    load_progress = Signal(str)  # the current load's stage
    engine_started = Signal(str)  # "" once the model thread imported the engine, else why it could not
    events = Signal(int, tuple)  # session id, batch: only the current session's
    bench_progress = Signal(int, int, str)  # runs done, runs in all, what runs now: the current benchmark's
    _request = Signal(object)
    _start_engine = Signal()

    def __init__(
        self,
        parent: QObject | None = None,
        session_fn: Callable | None = None,
        load_fn: Callable | None = None,
    ) -> None:
        """`session_fn` and `load_fn` stand in for the engine's `run_session` and `load_pair`
        (`ModelWorker`)."""
        super().__init__(parent)
        self._thread = QThread()
        self._thread.setObjectName("specdeck-models")
        self._worker = ModelWorker(session_fn, load_fn)
        self._worker.moveToThread(self._thread)
        self._thread.finished.connect(self._worker.deleteLater)
        self._request.connect(self._worker.handle)
        self._start_engine.connect(self._worker.start_engine)
        self._worker.engine_started.connect(self._on_engine_started)
        self._worker.progress.connect(self._on_progress)
        self._worker.events.connect(self._on_events)
        self._worker.finished.connect(self._on_finished)
        self._worker.failed.connect(self._on_failed)
        self._thread.start()
        self._current: dict[type, tuple[Request, asyncio.Future]] = {}  # by request kind
        self._next_id = 0
        self.pair: PairInfo | None = None
        self.engine_starting = False  # the model thread was asked to import the engine and has not yet
        self.engine_ready = False
        self.engine_failed = ""  # why the engine could not be imported, if it could not

    @property
    def engine_pending(self) -> bool:
        """Whether the engine is not there yet, and has not failed: starting, or yet to start."""
        return not (self.engine_ready or self.engine_failed)

    def start_engine(self) -> None:
        """Have the model thread import the engine now (once), while the GUI thread goes on."""
        if self.engine_pending and not self.engine_starting:
            self.engine_starting = True
            self._start_engine.emit()

    # requests ---------------------------------------------------------------------------------

    def load(self, spec: PairSpec) -> asyncio.Future:
        """Load the pair `spec` names in the model thread; the future gives its `PairInfo` or raises
        SpecDeckError (or LoadCancelled)."""
        request, future = self._submit(LoadRequest(spec))
        if not self.engine_ready:
            self.load_progress.emit(STARTING)  # the load waits for it in the model thread's queue
        return future

    def cancel_load(self) -> None:
        """Stop waiting for the current load; the model thread drops it at its next stage."""
        self._cancel(LoadRequest)

    def run(
        self, prompt: str, config: DecodeConfig, chat: bool = True, plain: bool = False
    ) -> tuple[int, asyncio.Future]:
        """Start a session (after any earlier one has stopped); returns its id and a future of its
        `SummaryEvent`, which raises SpecDeckError if the session failed."""
        self.stop()
        request, future = self._submit(SessionRequest(prompt, config, chat, plain))
        return request.request_id, future

    def stop(self) -> None:
        """Ask the current session to stop at its next round; its events up to there still arrive."""
        if SessionRequest in self._current:
            self._current[SessionRequest][0].cancel.set()

    def bench(
        self,
        prompts: list[BenchPrompt],
        settings: BenchSettings,
        source: str,
        command: str,
        drafters: tuple[PairSpec, ...] = (),
    ) -> asyncio.Future:
        """Benchmark the resident pair in the model thread, with `drafters` of its target beside its own
        drafter; the future gives a `BenchOutcome`, or raises SpecDeckError if the harness failed, or
        BenchCancelled."""
        return self._submit(BenchRequest(tuple(prompts), settings, source, command, tuple(drafters)))[1]

    def cancel_bench(self) -> None:
        """Stop waiting for the current benchmark; the model thread drops it before its next generation,
        and anything sent to the model thread after this runs once that generation is over."""
        self._cancel(BenchRequest)

    def shutdown(self, wait_ms: int | None = None) -> bool:
        """Stop whatever runs, end the model thread and wait for it (window closing), at most
        `wait_ms` (None: as long as it takes); whether the thread ended. A load stops only at its
        next stage, and one stage (reading a large file, building the row kernel) can take longer
        than a user waits for a window to close: the caller then ends the process without it."""
        for request, future in self._current.values():
            request.cancel.set()
            if not future.done():
                future.cancel()
        self._current.clear()
        self._thread.quit()
        return self._thread.wait() if wait_ms is None else self._thread.wait(wait_ms)

    @property
    def thread_running(self) -> bool:
        return self._thread.isRunning()

    def _submit(self, request: Request) -> tuple[Request, asyncio.Future]:
        """Send `request`, superseding the current one of its kind; the request as sent (with its id)
        and a future of its result."""
        self._cancel(type(request))
        self._next_id += 1
        request = replace(request, request_id=self._next_id)
        future = asyncio.get_event_loop().create_future()
        self._current[type(request)] = (request, future)
        self._request.emit(request)
        return request, future

    def _cancel(self, kind: type) -> None:
        """Cancel the current request of `kind`: its future raises its kind's `Cancelled` now."""
        current = self._current.pop(kind, None)
        if current is not None:
            request, future = current
            request.cancel.set()
            if not future.done():
                future.set_exception(request.cancelled(request.cancelled_message))

    # reports from the model thread ------------------------------------------------------------------

    def _request_of(self, request_id: int) -> Request | None:
        """The current request with this id, or None for a superseded one's late report."""
        return next((r for r, _ in self._current.values() if r.request_id == request_id), None)

    @Slot(str)
    def _on_engine_started(self, failure: str) -> None:
        self.engine_starting = False
        self.engine_ready, self.engine_failed = not failure, failure
        self.engine_started.emit(failure)

    @Slot(int, object)
    def _on_progress(self, request_id: int, report: object) -> None:
        request = self._request_of(request_id)
        if isinstance(request, LoadRequest):
            self.load_progress.emit(report)
        elif isinstance(request, BenchRequest):
            self.bench_progress.emit(*report)

    @Slot(int, tuple)
    def _on_events(self, request_id: int, batch: tuple) -> None:
        if self._request_of(request_id) is not None:
            self.events.emit(request_id, batch)

    @Slot(int, object)
    def _on_finished(self, request_id: int, result: object) -> None:
        if isinstance(result, PairInfo):
            self.pair = result  # the worker holds this pair now, even if nobody waits for it any more
        request = self._request_of(request_id)
        if request is not None:
            _, future = self._current.pop(type(request))
            if not future.done():
                future.set_result(result)

    @Slot(int, str, bool)
    def _on_failed(self, request_id: int, message: str, cancelled: bool) -> None:
        request = self._request_of(request_id)
        if request is not None:
            _, future = self._current.pop(type(request))
            if not future.done():
                future.set_exception(request.cancelled(message) if cancelled else SpecDeckError(message))
