"""The race after a Compare: both recorded sessions played side by side at their measured pace.

Honest by construction: nothing is decoded again. Each round's tokens appear when the replay's
clock passes the decoding time that round ended at (`RoundEvent.elapsed_s`, measured with a device
synchronisation, prefill excluded), so the side that decoded faster finishes first, by as much
as it did. Each side has its own progress and tokens/s.
"""

from __future__ import annotations

from collections import defaultdict

from PySide6.QtCore import QElapsedTimer, Qt, QTimer
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from specdeck.app.token_view import TokenView
from specdeck.engine.export import SessionRecord

TICK_MS = 30
WATCHABLE_S = 10.0  # the first speed stretches a shorter race to last this long
STRETCHED = f"slowed to {WATCHABLE_S:.0f} s"
# the replay's clock against decoding time: both sides at the same pace, so the race keeps its margin
SPEEDS = {STRETCHED: None, "1x (measured pace)": 1.0, "0.5x": 0.5, "0.25x": 0.25, "0.1x": 0.1, "0.02x": 0.02}


def timeline(record: SessionRecord) -> list[tuple[float, tuple]]:
    """(decoding time in s, events) per round: the round's token events and its round event, at the
    time the round ended."""
    tokens = defaultdict(list)
    for event in record.tokens:
        tokens[event.round].append(event)
    return [(r.elapsed_s, (*tokens[r.round], r)) for r in record.rounds]


class ReplayLane(QWidget):
    """One session's side of the race: its text, a progress bar over its kept tokens, its rate."""

    def __init__(self, title: str, record: SessionRecord, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.steps = timeline(record)
        self.total_tokens = record.summary.new_tokens if record.summary else 0
        self.view = TokenView(title)
        self.view.show_rejected.setChecked(False)
        self.view.show_rejected.setVisible(record.mode != "plain")  # plain decoding drafts nothing
        self.progress = QProgressBar()
        self.progress.setRange(0, max(1, self.total_tokens))
        self.progress.setFormat("%v/%m tokens")
        self.rate = QLabel()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.progress)
        layout.addWidget(self.rate)
        self.restart()

    def restart(self) -> None:
        self.view.clear()
        self.shown = 0  # steps[:shown] are in the view
        self.tokens = 0
        self.progress.setValue(0)
        self.rate.setText("–")

    @property
    def finished(self) -> bool:
        return self.shown == len(self.steps)

    @property
    def end_s(self) -> float:
        return self.steps[-1][0] if self.steps else 0.0

    def advance_to(self, t: float) -> None:
        """Show every round that had ended by decoding time `t` (seconds)."""
        while self.shown < len(self.steps) and self.steps[self.shown][0] <= t:
            _, events = self.steps[self.shown]
            self.view.add_events(events)
            self.tokens = events[-1].new_tokens
            self.shown += 1
        self.progress.setValue(self.tokens)
        if self.finished:
            self.rate.setText(f"finished in {self.end_s:.2f} s: {self.tokens / max(self.end_s, 1e-9):.1f} tokens/s")
        elif t > 0:
            self.rate.setText(f"{self.tokens / t:.1f} tokens/s so far")


class ReplayDialog(QDialog):
    """The two lanes, a speed and Restart; a timer moves the clock."""

    def __init__(self, speculative: SessionRecord, plain: SessionRecord, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Replay: speculative and plain decoding at their measured pace")
        self.lanes = (ReplayLane("Speculative", speculative), ReplayLane("Plain", plain))
        note = QLabel(
            "A replay of the measured decoding times of the last Compare (prefill excluded): nothing "
            "runs again, each round's tokens appear when its recorded time comes."
        )
        note.setWordWrap(True)
        self.speed = QComboBox()
        self.speed.addItems(list(SPEEDS))
        self.speed.setToolTip(
            "The replay's pace against the measured decoding time, the same for both sides; the clock "
            "shows decoding time"
        )
        self.speed.currentIndexChanged.connect(self.restart)  # a new pace plays from the start
        self.restart_button = QPushButton("Restart")
        self.restart_button.clicked.connect(self.restart)
        self.clock_label = QLabel()
        controls = QHBoxLayout()
        controls.addWidget(QLabel("Speed"))
        controls.addWidget(self.speed)
        controls.addWidget(self.restart_button)
        controls.addStretch(1)
        controls.addWidget(self.clock_label)
        lanes = QHBoxLayout()
        for lane in self.lanes:
            lanes.addWidget(lane, 1)
        layout = QVBoxLayout(self)
        layout.addWidget(note)
        layout.addLayout(controls)
        layout.addLayout(lanes, 1)
        self.resize(900, 500)
        self._clock = QElapsedTimer()
        self._timer = QTimer(self)
        self._timer.setTimerType(Qt.TimerType.PreciseTimer)
        self._timer.setInterval(TICK_MS)
        self._timer.timeout.connect(self._on_tick)
        self.restart()

    def restart(self) -> None:
        for lane in self.lanes:
            lane.restart()
        self._clock.start()
        self._timer.start()

    def advance_to(self, t: float) -> None:
        """Both lanes at decoding time `t`; the timer stops once both have finished."""
        for lane in self.lanes:
            lane.advance_to(t)
        self.clock_label.setText(f"decoding time {t:.2f} s")
        if all(lane.finished for lane in self.lanes):
            self._timer.stop()

    @property
    def pace(self) -> float:
        """Decoding seconds per second of replay: the chosen speed, or for `STRETCHED` what makes a
        race shorter than `WATCHABLE_S` last that long (a longer one plays at its measured pace)."""
        chosen = SPEEDS[self.speed.currentText()]
        if chosen is not None:
            return chosen
        end = max(lane.end_s for lane in self.lanes)
        return min(1.0, end / WATCHABLE_S) if end > 0 else 1.0

    def _on_tick(self) -> None:
        self.advance_to(self._clock.elapsed() / 1e3 * self.pace)

    def closeEvent(self, event) -> None:
        self._timer.stop()
        super().closeEvent(event)
