"""The model thread: one long-lived `QThread` whose worker owns the loaded models and runs sessions.

Threads: `ModelWorker` lives in the model thread (moveToThread) and is the only code that touches
torch. `ModelHost` (`model_host`) lives in the GUI thread; it sends requests to the worker through
queued signals and re-emits the worker's reports only for the current load or session, so a stopped
or superseded session's late events never reach the views. A benchmark (`specdeck.bench`) runs there
too, on the resident pair, like a long session: progress comes back as it goes, its files come back
at the end.

Events cross in batches: the worker collects a session's events and emits one tuple at most every
`BATCH_INTERVAL_S` (and at the end), so the GUI thread handles ~40 signals a second however fast
tokens come, and every event arrives exactly once, in order.

The engine (torch, transformers, the benchmark harness) is imported in the model thread, by
`ModelWorker.start_engine` (`engine_import`; `specdeck gui` has it under way since the launch), not
when this module is: the window imports only Qt and the engine's plain-Python modules, so it paints
seconds before torch has imported. Requests sent meanwhile wait in the model thread's queue and run
once the engine is there.
"""

from __future__ import annotations

import gc
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from PySide6.QtCore import QObject, Signal, Slot

from specdeck.app.engine_import import Engine, import_engine
from specdeck.bench.prompts import BenchPrompt
from specdeck.bench.settings import BenchSettings
from specdeck.engine.config import DecodeConfig
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.events import SummaryEvent
from specdeck.engine.pair_spec import PairSpec

if TYPE_CHECKING:
    from specdeck.engine.drafting.layer_skip import LayerChoice
    from specdeck.engine.pair import ModelPair

BATCH_INTERVAL_S = 0.025


def freeze_long_lived_objects(unfreeze: bool = True) -> None:
    """Collect garbage once, then leave every object alive now out of later collections (gc.freeze).

    A full collection scans every tracked object while holding the GIL. With torch, transformers,
    Qt and a loaded model that is ~400k objects and 150-400 ms in which the GUI thread cannot run,
    and a fast session's events trigger one every few seconds, whichever thread allocates. The
    objects alive after start-up or a load (modules, classes, widgets, the models) live as long as
    the process or the pair, so they need no scanning. `unfreeze` first lets the collection free a
    replaced pair's reference cycles; without it only what came since the last freeze is scanned
    (after a first load: a few milliseconds, where unfreezing scans the imports again)."""
    if unfreeze:
        gc.unfreeze()
    gc.collect()
    gc.freeze()


class Cancelled(Exception):
    """The user cancelled a request; raised from its progress callback at the next check."""


class LoadCancelled(Cancelled):
    """Loading was cancelled, at the next stage."""


class BenchCancelled(Cancelled):
    """A benchmark was cancelled, before its next timed run."""


@dataclass(frozen=True)
class Request:
    """Work for the model thread. One of each kind is current at a time; its id tells its reports
    from a superseded one's, and `cancel` asks the model thread to drop it."""

    request_id: int = field(default=0, compare=False, kw_only=True)
    cancel: threading.Event = field(default_factory=threading.Event, compare=False, kw_only=True)
    cancelled: ClassVar[type[Cancelled]] = Cancelled
    cancelled_message: ClassVar[str] = "Cancelled."


@dataclass(frozen=True)
class LoadRequest(Request):
    spec: PairSpec
    cancelled: ClassVar[type[Cancelled]] = LoadCancelled
    cancelled_message: ClassVar[str] = "Loading was cancelled."


@dataclass(frozen=True)
class PairInfo:
    """What the GUI may know about the resident pair (never the models themselves)."""

    description: str
    target: str
    draft: str | None
    drafter: str | None
    device: str
    dtype: str
    vocabulary: str = ""  # a draft model's vocabulary case against the target's, in words
    backend: str = "float32"  # what runs the target, in words (`LoadedModel.runs`)
    layers: str = ""  # the layer-skip drafter's layers and what each count measured, in words
    note: str = ""  # why the drafter left to its default is not SpecDeck's own (`ModelPair.note`)


@dataclass(frozen=True)
class SessionRequest(Request):
    prompt: str
    config: DecodeConfig
    chat: bool = True
    plain: bool = False


@dataclass(frozen=True)
class BenchRequest(Request):
    prompts: tuple[BenchPrompt, ...]
    settings: BenchSettings
    source: str  # the prompt file, as the report names it
    command: str  # the `specdeck bench` command line that reproduces the run
    drafters: tuple[PairSpec, ...] = ()  # more drafters of the resident target, timed beside its own
    cancelled: ClassVar[type[Cancelled]] = BenchCancelled
    cancelled_message: ClassVar[str] = "The benchmark was cancelled."


@dataclass(frozen=True)
class BenchOutcome:
    """A finished benchmark: summary.csv's rows, and every file `specdeck bench` writes, by name."""

    summary: list[dict]
    files: dict[str, bytes]


def describe(pair: ModelPair) -> PairInfo:
    runs = pair.target.runs
    # on llama.cpp the weights are the file's own blocks: their type is the dtype, not torch's float32
    dtype = runs.removeprefix("llama.cpp ") if runs.startswith("llama.cpp ") else str(pair.target.dtype)
    return PairInfo(
        pair.description,
        pair.target.name,
        pair.drafter_model,
        pair.drafter_kind and pair.drafter_kind.value,
        str(pair.target.device),
        dtype.removeprefix("torch."),
        pair.vocabulary.describe() if pair.vocabulary is not None else "",
        runs,
        _layers(pair.layer_choice),
        pair.note,
    )


def _layers(choice: LayerChoice | None) -> str:
    """The layer-skip drafter's choice as the drafter's tooltip says it; "" for another drafter."""
    if choice is None:
        return ""
    why = "as set" if choice.chosen_by == "set" else "the count measured to pay best"
    return f"Drafting with the {choice.describe()}, {why}. Measured: {choice.table()}"


def error_message(error: BaseException) -> str:
    """A SpecDeckError's message as-is; anything else with its type, since it is a bug or a bad
    model. (Running out of memory, which only the model thread's work does, is told there:
    `ModelWorker.handle`.)"""
    if isinstance(error, SpecDeckError):
        return str(error)
    detail = traceback.format_exception_only(type(error), error)[-1].strip()
    return f"Unexpected error: {detail}"


class ModelWorker(QObject):
    """Lives in the model thread. Owns the `ModelPair`; `handle` runs any request and reports its
    end as `finished` or `failed`, never letting an exception kill the thread."""

    engine_started = Signal(str)  # "" once the engine imported, else why it could not
    progress = Signal(int, object)  # request id, what it does now (a load's stage; a benchmark's runs)
    events = Signal(int, tuple)  # request id, a session's events in order
    finished = Signal(int, object)  # request id, result (PairInfo, SummaryEvent or BenchOutcome)
    failed = Signal(int, str, bool)  # request id, message, cancelled

    def __init__(
        self,
        session_fn: Callable | None = None,
        load_fn: Callable | None = None,
        attach_fn: Callable | None = None,
    ) -> None:
        """`session_fn`, `load_fn` and `attach_fn` stand in for the engine's `run_session`,
        `load_pair` and `add_drafters` (None: the engine's own, once imported)."""
        super().__init__()
        self._session_fn = session_fn
        self._load_fn = load_fn
        self._attach_fn = attach_fn
        self._engine: Engine | None = None
        self._engine_failed = ""  # why the engine could not be imported, once it was tried
        self._pair: ModelPair | None = None
        self._spec: PairSpec | None = None  # what the resident pair was loaded from
        self._handlers = {LoadRequest: self._load, SessionRequest: self._run, BenchRequest: self._bench}

    @Slot()
    def start_engine(self) -> None:
        """Import the engine here, in the model thread, once; `engine_started` says how it went."""
        if self._engine is None and not self._engine_failed:
            try:
                self._engine = import_engine()
            except Exception as error:
                self._engine_failed = (
                    f"The engine could not start ({error_message(error)}): reinstall SpecDeck with its dependencies."
                )
            self.engine_started.emit(self._engine_failed)

    @property
    def engine(self) -> Engine:
        """The imported engine (imported now if no request asked for it yet); a SpecDeckError if it failed."""
        self.start_engine()
        if self._engine is None:
            raise SpecDeckError(self._engine_failed)
        return self._engine

    @Slot(object)
    def handle(self, request: Request) -> None:
        try:
            result = self._handlers[type(request)](request)
        except Cancelled:
            self.failed.emit(request.request_id, request.cancelled_message, True)
        except BaseException as error:
            self.failed.emit(request.request_id, self._failure(error), False)
        else:
            self.finished.emit(request.request_id, result)

    def _failure(self, error: BaseException) -> str:
        """What a failed request says; whatever it had allocated is given back (after running out of
        memory, for the next request)."""
        memory = self._engine.memory if self._engine is not None else None
        if memory is None:
            return error_message(error)
        memory.give_back()
        return memory.out_of_memory_message(error) if memory.is_out_of_memory(error) else error_message(error)

    def _progress(self, request: Request, report: object) -> None:
        if request.cancel.is_set():
            raise request.cancelled
        self.progress.emit(request.request_id, report)

    def _resident_pair(self) -> ModelPair:
        if self._pair is None:
            raise SpecDeckError("No models are loaded: press Load first.")
        return self._pair

    def _load(self, request: LoadRequest) -> PairInfo:
        """Load the pair; where only its drafter changed, the resident target stays and only the
        drafter loads."""
        self._progress(request, "Starting")
        progress = lambda stage: self._progress(request, stage)  # noqa: E731
        spec, resident = request.spec, self._spec
        if (
            self._pair is not None
            and resident is not None
            and spec.with_drafter(None, None) == resident.with_drafter(None, None)
        ):
            progress(f"Keeping {self._pair.target.name} loaded")
            attach = self._attach_fn or self.engine.session.add_drafters
            pair = attach(self._pair, [spec], progress=progress)[0]
        else:
            load = self._load_fn or self.engine.session.load_pair
            pair = load(spec, progress=progress)
        if request.cancel.is_set():
            raise LoadCancelled
        replaced = self._pair is not None
        self._pair, self._spec = pair, spec  # the previous pair is released only once the new one loaded
        freeze_long_lived_objects(unfreeze=replaced)  # the first load has no pair's cycles to free
        self.engine.memory.give_back(collect=False)  # the previous pair's memory, now collected
        return describe(pair)

    def _run(self, request: SessionRequest) -> SummaryEvent | None:
        """Stream the session's events in batches; Stop (`cancel`) ends it at a round, not as a failure."""
        pair = self._resident_pair()
        session = self._session_fn or self.engine.session.run_session
        batch: list = []
        summary = None
        last_emit = time.perf_counter()
        try:
            for event in session(
                pair, request.prompt, request.config, chat=request.chat, plain=request.plain, cancel=request.cancel
            ):
                batch.append(event)
                now = time.perf_counter()
                if isinstance(event, SummaryEvent):
                    summary = event
                if now - last_emit >= BATCH_INTERVAL_S or summary is not None:
                    self.events.emit(request.request_id, tuple(batch))
                    batch = []
                    last_emit = now
        finally:
            if batch:
                self.events.emit(request.request_id, tuple(batch))
        return summary

    def _bench(self, request: BenchRequest) -> BenchOutcome:
        """Run the benchmark harness and write its files into a temporary folder, then send them back.

        The harness reports progress once before each timed generation, so its signals are as rare
        as generations; the cancel check there stops it before the next one."""
        pair = self._resident_pair()

        def progress(done: int, total: int, label: str) -> None:
            self._progress(request, (done, total, label))

        pairs = [pair]
        if request.drafters:  # loaded for this benchmark only, on the resident target
            progress(0, 0, "Loading the other drafters…")
            pairs += self.engine.session.add_drafters(
                pair, request.drafters, progress=lambda stage: progress(0, 0, stage)
            )
        service = self.engine.service
        context = service.report_context(pairs, request.source, request.command)
        with tempfile.TemporaryDirectory(prefix="specdeck-bench-") as folder:
            written = service.run_and_write(
                pairs, list(request.prompts), request.settings, Path(folder), context, progress=progress
            )
            files = {name: (written.folder / name).read_bytes() for name in written.files}
        return BenchOutcome(written.summary, files)
