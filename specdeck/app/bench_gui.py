"""Responsiveness benchmark of the window: feed it synthetic events at a fixed token rate through
the real path (model thread, batched signals, token view, charts) and report the longest stall of
the GUI event loop, the drawing cost per token, and whether any event was lost.

    python -m specdeck.app.bench_gui [--rate 2000] [--seconds 20]

A 2 ms precise timer in the GUI thread records the gap between its ticks; a gap well beyond 2 ms
is time the event loop could not answer (a stall). The (fake) pair is loaded and the window drawn
before anything is measured. On a shared machine the operating system causes stalls too, so the
same probe first runs for 2 s on the idle window (the machine's own baseline), and every gap is
split into the GUI thread's CPU time (work the window did), its run-queue wait (Linux: runnable
but another process had the core) and the rest: waiting for the GIL or a lock, or time a virtual
machine's hypervisor gave to other machines (reported as the stolen share). Drawing cost is the time
spent in the token view, the chart buffers and the chart redraws (Python side; Qt's painting shows
in the stall and in the GUI thread's CPU share), divided by the tokens shown.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import threading
import time
from dataclasses import dataclass

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import qasync
from PySide6.QtCore import QElapsedTimer, Qt, QTimer
from PySide6.QtWidgets import QApplication

from specdeck.app.main_window import MainWindow
from specdeck.app.model_host import ModelHost
from specdeck.app.worker import freeze_long_lived_objects
from specdeck.engine.events import RoundEvent, SessionStarted, TokenEvent, TokenState
from specdeck.engine.stats import SessionStats

PROBE_MS = 2
GOAL_MS = 50
SETTLE_S = 1.0  # after loading: the window's first full paints are not part of the stream
IDLE_S = 2.0  # probe the idle window first: stalls the machine causes, not the window
WORDS = (" the", " model", " drafts", " tokens", " and", " checks", " them", ".", "\n")


@dataclass
class SyntheticSource:
    """A fake session: rounds of K=4 drafts (accepted, then rejected with a resample, or a bonus),
    paced so that `rate` kept tokens are emitted per second for `seconds`."""

    rate: float
    seconds: float
    token_events: int = 0

    def __call__(self, pair, prompt, config, chat=True, plain=False, cancel: threading.Event | None = None):
        stats = SessionStats()
        start = SessionStarted("speculative", "synthetic", 8, 0.0)
        stats.add(start)
        yield start
        began = time.perf_counter()
        pos = round_no = 0
        while True:
            elapsed = time.perf_counter() - began
            if elapsed >= self.seconds or (cancel is not None and cancel.is_set()):
                break
            ahead = pos / self.rate - elapsed
            if ahead > 0:
                time.sleep(ahead)
            round_no += 1
            accepted = round_no % 5  # 0..4 of 4 drafts: every outcome, in turn
            events = [
                TokenEvent(TokenState.ACCEPTED, 1, WORDS[(pos + i) % len(WORDS)], pos + i, round_no, 0.9, 0.8)
                for i in range(min(accepted, 4))
            ]
            if accepted < 4:
                events += [
                    TokenEvent(TokenState.REJECTED, 2, " draft", pos + accepted, round_no, 0.1, 0.6)
                    for _ in range(4 - accepted)
                ]
                events.append(TokenEvent(TokenState.RESAMPLED, 3, " fix", pos + accepted, round_no, 0.5, 0.1))
            else:
                events.append(TokenEvent(TokenState.BONUS, 4, " more", pos + 4, round_no, 0.7, None))
            kept = sum(e.state.kept for e in events)
            pos += kept
            self.token_events += len(events)
            events.append(RoundEvent(round_no, 4, min(accepted, 4), 0.1, 0.4, pos, time.perf_counter() - began))
            for event in events:
                stats.add(event)
                yield event
        yield stats.summary("", "max_new_tokens")


class _FakePair:
    description = "synthetic events"
    drafter_kind = None
    drafter_model = None

    class target:
        name = "synthetic"
        device = "cpu"
        dtype = "float32"


class TimedApplication(QApplication):
    """Records the GUI thread's CPU time for each event it handles: the work a stall is made of,
    apart from time the operating system gave to other processes."""

    def __init__(self, argv: list[str]) -> None:
        super().__init__(argv)
        self.gui_thread = threading.get_ident()
        self.longest_event_cpu_ms = 0.0
        self.longest_event = ""
        self.recording = False

    def notify(self, receiver, event) -> bool:
        if not self.recording or threading.get_ident() != self.gui_thread:
            return super().notify(receiver, event)
        started = time.thread_time()
        try:
            return super().notify(receiver, event)
        finally:
            cpu_ms = 1e3 * (time.thread_time() - started)
            if cpu_ms > self.longest_event_cpu_ms:
                self.longest_event_cpu_ms = cpu_ms
                self.longest_event = f"{event.type().name} to {type(receiver).__name__}"


def _scheduler_ms() -> tuple[float, float]:
    """(CPU time, run-queue wait) of the calling thread in ms; the wait is 0 where Linux's
    schedstat is missing."""
    try:
        with open("/proc/thread-self/schedstat") as stat:
            on_cpu, waiting, _ = stat.read().split()
        return int(on_cpu) / 1e6, int(waiting) / 1e6
    except (OSError, ValueError):
        return 1e3 * time.thread_time(), 0.0


def _stolen_ms() -> float:
    """CPU time the hypervisor gave to other machines, all cores together (Linux; 0 elsewhere)."""
    try:
        with open("/proc/stat") as stat:
            return 1e3 * int(stat.readline().split()[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


@dataclass
class Gap:
    """The time between two probe ticks, split by what the GUI thread was doing."""

    ms: float
    cpu_ms: float  # the GUI thread ran: work the window did
    waiting_ms: float  # runnable, but the operating system ran something else

    @property
    def other_ms(self) -> float:
        return max(0.0, self.ms - self.cpu_ms - self.waiting_ms)


class StallProbe:
    """Records the gaps between ticks of a precise 2 ms timer in the GUI thread."""

    def __init__(self) -> None:
        self.clock = QElapsedTimer()
        self.gaps: list[Gap] = []
        self.timer = QTimer()
        self.timer.setTimerType(Qt.TimerType.PreciseTimer)
        self.timer.setInterval(PROBE_MS)
        self.timer.timeout.connect(self._on_tick)
        self._scheduler = (0.0, 0.0)
        self._began = (0.0, 0.0)  # wall clock and stolen CPU at start
        self.stolen_share = 0.0

    def start(self) -> None:
        self.clock.start()
        self._scheduler = _scheduler_ms()
        self._began = (time.perf_counter(), _stolen_ms())
        self.timer.start()

    def stop(self) -> None:
        self.timer.stop()
        wall_ms = 1e3 * (time.perf_counter() - self._began[0])
        self.stolen_share = (_stolen_ms() - self._began[1]) / max(1e-9, wall_ms * (os.cpu_count() or 1))

    def _on_tick(self) -> None:
        cpu, waiting = _scheduler_ms()
        self.gaps.append(Gap(self.clock.nsecsElapsed() / 1e6, cpu - self._scheduler[0], waiting - self._scheduler[1]))
        self.clock.restart()
        self._scheduler = (cpu, waiting)

    def figures(self, prefix: str) -> dict:
        """Longest gap (and how it splits), 99.9th percentile, gaps over the goal, longest GUI work."""
        if not self.gaps:
            return {}
        ms = sorted(g.ms for g in self.gaps)
        longest = max(self.gaps, key=lambda g: g.ms)
        return {
            f"{prefix}longest stall ms": longest.ms,
            f"{prefix}  GUI CPU / run-queue wait / other ms": f"{longest.cpu_ms:.1f} / {longest.waiting_ms:.1f} / {longest.other_ms:.1f}",
            f"{prefix}99.9th percentile gap ms": ms[int(0.999 * (len(ms) - 1))],
            f"{prefix}gaps over {GOAL_MS} ms": sum(g.ms > GOAL_MS for g in self.gaps),
            f"{prefix}most GUI CPU in one gap ms": max(g.cpu_ms for g in self.gaps),
            f"{prefix}CPU stolen by the hypervisor, share": self.stolen_share,
        }


class CollectionWatch:
    """The longest garbage collection while recording (it holds the GIL, so it stalls the GUI
    thread whichever thread ran it)."""

    def __init__(self) -> None:
        self.longest_ms = 0.0
        self.generation = -1
        self._started = 0.0
        self.recording = False
        gc.callbacks.append(self._on_collection)

    def _on_collection(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self.recording and 1e3 * (time.perf_counter() - self._started) > self.longest_ms:
            self.longest_ms = 1e3 * (time.perf_counter() - self._started)
            self.generation = info["generation"]


def _timed(accumulator: list[float], function):
    """`function`, adding its wall time to accumulator[0]; accumulator[1] counts the timed calls
    running, so that a call made from inside another one is not counted twice."""

    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        accumulator[1] += 1
        try:
            return function(*args, **kwargs)
        finally:
            accumulator[1] -= 1
            if not accumulator[1]:
                accumulator[0] += time.perf_counter() - started

    return wrapper


async def measure(window: MainWindow, source: SyntheticSource) -> dict:
    view, buffers, redraw = [0.0, 0], [0.0, 0], [0.0, 0]
    window.speculative_view.add_events = _timed(view, window.speculative_view.add_events)
    window.speculative_view._render = _timed(view, window.speculative_view._render)
    window.charts.add_events = _timed(buffers, window.charts.add_events)
    window.charts.redraw = _timed(redraw, window.charts.redraw)
    window.charts._parts = tuple(_timed(redraw, part) for part in window.charts._parts)
    await window.load_models()
    await asyncio.sleep(SETTLE_S)
    idle = StallProbe()
    idle.start()
    await asyncio.sleep(IDLE_S)
    idle.stop()
    app = QApplication.instance()
    probe = StallProbe()
    collections = CollectionWatch()
    probe.start()
    app.recording = collections.recording = True
    cpu_started = time.thread_time()
    await window.run(compare=False)
    gui_cpu_s = time.thread_time() - cpu_started
    app.recording = collections.recording = False
    probe.stop()
    await asyncio.sleep(0)  # what follows is the benchmark's own bookkeeping: not the window's events
    drawing = [view[0] + buffers[0] + redraw[0]]
    record = window.session_model.records[0]
    shown = len(window.speculative_view.tokens)
    kept = [e.pos for e in window.speculative_view.tokens if e.state.kept]
    return {
        "token events sent": source.token_events,
        "token events shown": shown,
        "kept tokens": len(kept),
        "lost events": source.token_events - shown,
        "kept positions contiguous": kept == list(range(len(kept))),
        "rounds": record.summary.rounds,
        "tokens/s (kept)": record.summary.tokens_per_s,
        **idle.figures(f"idle window, {IDLE_S:.0f} s: "),
        **probe.figures("session: "),
        "longest garbage collection ms": collections.longest_ms,
        "  of generation": collections.generation,
        "longest event handled, GUI CPU ms": app.longest_event_cpu_ms,
        "  which was": app.longest_event,
        "GUI thread CPU share of wall time": gui_cpu_s / max(1e-9, record.summary.decode_s),
        "drawing cost per kept token us": 1e6 * drawing[0] / max(1, len(kept)),
        "drawing cost per token event us": 1e6 * drawing[0] / max(1, shown),
        "  of which token view us": 1e6 * view[0] / max(1, shown),
        "  of which chart buffers us": 1e6 * buffers[0] / max(1, shown),
        "  of which chart redraws us": 1e6 * redraw[0] / max(1, shown),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdeck.app.bench_gui", description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=2000.0, help="kept tokens per second")
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args(argv)
    app = QApplication.instance() or TimedApplication(sys.argv[:1])
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    source = SyntheticSource(args.rate, args.seconds)
    host = ModelHost(session_fn=source, load_fn=lambda *a, **k: _FakePair())
    with loop:
        window = MainWindow(settings=None, host=host)
        window.decoding_panel.max_new_tokens.setValue(8192)
        window.show()
        freeze_long_lived_objects()
        result = loop.run_until_complete(measure(window, source))
        window.close()
    print(
        f"window responsiveness at {args.rate:.0f} tokens/s for {args.seconds:.0f} s "
        f"(Qt platform {app.platformName()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}):"
    )
    for name, value in result.items():
        print(f"  {name:58s} {value:.2f}" if isinstance(value, float) else f"  {name:58s} {value}")
    print(
        f"Stalls the window causes show as GUI CPU (goal: under {GOAL_MS} ms in any gap); run-queue wait, "
        "stolen CPU and gaps the idle window has too are the machine's."
    )
    return 0 if result["lost events"] == 0 and result["kept positions contiguous"] else 1


if __name__ == "__main__":
    sys.exit(main())
