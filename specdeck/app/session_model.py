"""What the window knows, apart from how it shows it: the resident pair (or why the last load
failed, and which field was wrong), the sessions of the last run with their events, what is
running, and what File > Export writes.

Qt-free, as napari's models are: the Qt views subscribe to its `Emitter`s and draw; the
controller (`specdeck.app.controller`) changes it. Everything here happens in the GUI thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specdeck.app.verdict import Verdict, verdict_of
from specdeck.engine.context import prompt_cut_notice
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.events import SessionStarted, SummaryEvent
from specdeck.engine.export import RunInfo, SessionRecord, export_sessions
from specdeck.engine.pair_spec import PairSpec


class Emitter:
    """A list of callbacks, called in the order they connected with what is emitted."""

    def __init__(self) -> None:
        self._callbacks: list[Callable] = []

    def connect(self, callback: Callable) -> None:
        self._callbacks.append(callback)

    def emit(self, *args) -> None:
        for callback in list(self._callbacks):
            callback(*args)


@dataclass(frozen=True)
class LoadFailure:
    """A load that failed: what was asked for, the message, and the model panel's field it blames
    ("target", "draft", "device", "dtype", "backend"), or None when the message names none of them."""

    spec: PairSpec
    message: str
    field: str | None


def blamed_field(spec: PairSpec, message: str) -> str | None:
    """The field of `spec` that `message` is about: one whose value it quotes as messages quote a
    name ('name'), else one whose value it holds, else one it names. Quoted first: a message about
    the target may list the built-in models, the draft's name among them."""
    lowered = message.lower()
    if lowered.startswith("the llama.cpp backend"):  # what it runs, and needs: the choice of backend is to blame
        return "backend"
    for name, value in (("target", spec.target), ("draft", spec.draft)):
        if value and repr(value) in message:
            return name
    if spec.draft and spec.draft in message or "vocabular" in lowered or "feature head" in lowered:
        return "draft"
    if spec.target in message:
        return "target"
    for name in ("device", "dtype", "backend"):  # a message about the device or dtype may offer another backend
        if name in lowered:
            return name
    return None


@dataclass(frozen=True)
class Activity:
    """What runs now: a load, a session (or compare run), a benchmark; all False when idle."""

    loading: bool = False
    running: bool = False
    benchmarking: bool = False

    @property
    def busy(self) -> bool:
        return self.loading or self.running or self.benchmarking


class SessionModel:
    """The window's state. Emitters (arguments in brackets):

    - `pair_changed` (): a load ended, well (`pair`) or not (`load_failure`);
    - `activity_changed` (Activity): something started or ended;
    - `run_started` (compare): the views start over;
    - `events_arrived` (record, batch): a batch of a session's events, kept in its record;
    - `run_ended` (): the run's sessions are over, their summaries in `records`;
    - `status` (text): a line for the status bar.
    """

    def __init__(self) -> None:
        self.pair = None  # `specdeck.app.worker.PairInfo` of the resident pair
        self.spec: PairSpec | None = None  # what the resident pair was loaded from
        self.load_failure: LoadFailure | None = None
        self.activity = Activity()
        self.run_info: RunInfo | None = None
        self.records: list[SessionRecord] = []
        self.compare = False
        self.prompt_notice = ""  # what truncation did to the last run's prompt
        self._by_session: dict[int, SessionRecord] = {}
        self._starts: dict[str, SessionStarted] = {}  # each session's start, by mode: its measured costs
        self.pair_changed = Emitter()
        self.activity_changed = Emitter()
        self.run_started = Emitter()
        self.events_arrived = Emitter()
        self.run_ended = Emitter()
        self.status = Emitter()

    # loading ----------------------------------------------------------------------------------------

    def set_loaded(self, spec: PairSpec, pair) -> None:
        self.spec, self.pair, self.load_failure = spec, pair, None
        self.pair_changed.emit()
        self.status.emit(f"Loaded {pair.description}")

    def set_load_failed(self, spec: PairSpec, message: str) -> None:
        """The load of `spec` failed. The model thread keeps the pair it had (if any), so `pair` stays;
        the views show the failure until a load succeeds."""
        self.load_failure = LoadFailure(spec, message, blamed_field(spec, message))
        self.pair_changed.emit()

    def needs_load(self, spec: PairSpec) -> bool:
        return self.pair is None or self.spec != spec

    # what runs --------------------------------------------------------------------------------------

    def set_activity(self, **changes: bool) -> None:
        self.activity = Activity(**{**self.activity.__dict__, **changes})
        self.activity_changed.emit(self.activity)

    # sessions ---------------------------------------------------------------------------------------

    def start_run(self, info: RunInfo, compare: bool) -> None:
        self.run_info, self.compare = info, compare
        self.records = []
        self._by_session.clear()
        self._starts.clear()
        self.prompt_notice = ""
        self.run_started.emit(compare)

    def start_session(self, session_id: int, plain: bool) -> SessionRecord:
        record = SessionRecord(session_id, "plain" if plain else "speculative")
        self.records.append(record)
        self._by_session[session_id] = record
        self.status.emit("Plain decoding…" if plain else "Speculative decoding…")
        return record

    def add_events(self, session_id: int, batch: tuple) -> None:
        """Keep a batch of the session's events and pass it on; batches of other sessions are dropped."""
        record = self._by_session.get(session_id)
        if record is None:
            return
        for event in batch:
            record.add(event)
            if isinstance(event, SessionStarted):
                self._starts[record.mode] = event
                if event.prompt_tokens_dropped:
                    self.prompt_notice = prompt_cut_notice(event.prompt_tokens, event.prompt_tokens_dropped)
        self.events_arrived.emit(record, batch)

    def end_run(self) -> None:
        self.run_ended.emit()

    def summary(self, mode: str) -> SummaryEvent | None:
        """The last run's summary of the `mode` ("speculative" or "plain") session, if it ended."""
        return next((r.summary for r in self.records if r.mode == mode), None)

    def verdict(self) -> Verdict | None:
        """What the last run came to (`specdeck.app.verdict`), once its speculative session ended."""
        speculative = self.summary("speculative")
        if speculative is None or self.run_info is None:
            return None
        return verdict_of(
            self.run_info.backend,
            speculative,
            self.summary("plain"),
            self._starts.get("speculative"),
            self.run_info.config.greedy,
            self.compare,
        )

    @property
    def identical(self) -> bool | None:
        """Whether a greedy compare run's two texts are equal; None for anything else (a stopped
        run's texts end where they were stopped)."""
        verdict = self.verdict()
        return verdict.identical if verdict is not None else None

    # export -----------------------------------------------------------------------------------------

    def export(self, path: str | Path, per_token: bool) -> list[Path]:
        """Write the last run's round CSV and metadata (and token rows if asked); raises SpecDeckError."""
        if not self.records or self.run_info is None:
            raise SpecDeckError("Nothing to export yet: run a session first.")
        return export_sessions(path, self.run_info, self.records, per_token=per_token)
