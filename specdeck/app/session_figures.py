"""The headline figures of a session beside or below its charts (`specdeck.app.charts`): acceptance rate,
copied drafts, mean accepted length, tokens/s (speculative and plain), rounds, draft shapes, draft
and verify time, the predicted and measured speedups, whether greedy outputs matched, the backend.

Each figure is a bold label of a fixed size beside its name, both with a tooltip that says what it
counts. A widget of its own, apart from the charts, so that what the figures say and how they are
laid out reads in one place; the charts hand it their series at each redraw. The predicted speedup
is Leviathan et al. 2023, eq. 1 (see `specdeck.engine.stats`).
"""

from __future__ import annotations

from PySide6.QtCore import QSize
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QGridLayout, QLabel, QWidget

from specdeck.app.chart_series import SessionSeries, shape_shares

WIDEST_FIGURE = "0.000  (000000/000000)"  # the acceptance rate of a million-token session

FIGURE_TIPS = {
    "acceptance rate": "Drafts the target accepted, of all drafts proposed (a draft discarded after an earlier "
    "rejection counts as not accepted; acceptance by depth counts judged drafts only)",
    "copied drafts": "Drafts that prompt lookup copied from earlier text (Lookup > 0): accepted of copied",
    "mean accepted length": "Tokens kept per round, the target's own token included: plain decoding scores 1",
    "tokens/s": "Kept tokens per second of decoding, prefill excluded",
    "plain tokens/s": "The same for the plain half of a compare run",
    "rounds": "Target forwards (one verify per round)",
    "draft shapes": "The rounds' draft shapes: K=n drafted a chain of n tokens (wN: N candidates for the first), "
    "copy n copied n by prompt lookup, none was a plain step",
    "draft / verify": "Mean time per round spent drafting and in the target's verify forward",
    "predicted speedup": "Leviathan et al. 2023, eq. 1: (1 - a^(K+1)) / ((1 - a)(cK + 1)), with a the measured "
    "acceptance rate, K the mean drafts per round and c the measured cost of one draft token "
    "over one verify: what the rounds should gain over plain decoding on this machine",
    "measured speedup": "Speculative tokens/s over plain tokens/s, measured by Compare on the same prompt and settings",
    "greedy outputs": "Whether Compare's speculative and plain texts are identical (greedy runs must be)",
    "backend": "What ran the target: torch, or llama.cpp on the GGUF file's quantized weights (their type named)",
}


class SessionFigures(QWidget):
    """The figures: `labels` holds each figure's value by its name (the keys of `FIGURE_TIPS`)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.labels = {name: QLabel("–") for name in FIGURE_TIPS}
        bold = QFont()
        bold.setBold(True)
        self._names = {}
        for name, label in self.labels.items():
            label.setFont(bold)
            # a fixed size, as wide as the widest figure: a label that grew with its text would
            # relayout the panel and resize (so repaint) all the charts
            label.setText(WIDEST_FIGURE)
            label.setFixedSize(label.sizeHint())
            label.setText("–")
            label.setToolTip(FIGURE_TIPS[name])
            self._names[name] = QLabel(name)
            self._names[name].setToolTip(FIGURE_TIPS[name])
        self._grid = QGridLayout()
        self._grid.setVerticalSpacing(2)
        self.setLayout(self._grid)
        self.column_width = (
            max(label.width() for label in self.labels.values())
            + max(label.sizeHint().width() for label in self._names.values())
            + 24
        )

    def place(self, beside: bool, columns: int) -> None:
        """One figure a row beside the charts, else `columns` figures a row below them."""
        for i, name in enumerate(self.labels):
            row, column = (i, 0) if beside else (i // columns, 2 * (i % columns))
            self._grid.addWidget(self._names[name], row, column)
            self._grid.addWidget(self.labels[name], row, column + 1)

    def show_figures(
        self,
        speculative: SessionSeries,
        plain_series: SessionSeries | None,
        identical: bool | None,
        measured: float | None,
        backend: str | None,
    ) -> None:
        """The figures of the speculative session, the plain one of a compare run (if any), whether
        their greedy outputs matched, the measured speedup and the backend that ran the target."""
        stats = speculative.stats
        f = self.labels
        has_drafts = stats.drafted > 0
        f["acceptance rate"].setText(
            f"{stats.acceptance_rate:.3f}  ({stats.accepted}/{stats.drafted})" if has_drafts else "–"
        )
        f["copied drafts"].setText(
            f"{stats.copied_accepted}/{stats.copied_drafted} accepted" if stats.copied_drafted else "–"
        )
        f["mean accepted length"].setText(f"{stats.mean_accepted_length:.2f}" if stats.rounds else "–")
        f["tokens/s"].setText(_rate(stats.tokens_per_s) if stats.rounds else "–")
        plain = plain_series.stats if plain_series is not None else None
        f["plain tokens/s"].setText(_rate(plain.tokens_per_s) if plain and plain.rounds else "–")
        f["rounds"].setText(str(stats.rounds) if stats.rounds else "–")
        f["draft shapes"].setText(shape_shares(speculative.shapes) if has_drafts or stats.rounds else "–")
        f["draft / verify"].setText(
            f"{stats.draft_ms / stats.rounds:.1f} / {stats.verify_ms / stats.rounds:.1f} ms" if stats.rounds else "–"
        )
        summary = speculative.summary
        f["draft shapes"].setToolTip(
            _plan_tooltip(summary.plan) if summary is not None and summary.plan else FIGURE_TIPS["draft shapes"]
        )
        predicted = stats.predicted_speedup
        f["predicted speedup"].setText(f"{predicted:.2f}x" if predicted is not None else "–")
        f["measured speedup"].setText(f"{measured:.2f}x" if measured is not None else "–")
        f["backend"].setText(backend if backend is not None else "–")
        if identical is None:
            f["greedy outputs"].setText("–")
            f["greedy outputs"].setStyleSheet("")
        else:
            f["greedy outputs"].setText("identical ✓" if identical else "differ ✗")
            f["greedy outputs"].setStyleSheet(f"color: {'#1b8a2f' if identical else '#c62828'};")


HEADLINE = {  # the figures always in view above the charts: name shown, figure it repeats
    "tokens/s": "tokens/s",
    "plain": "plain tokens/s",
    "acceptance": "acceptance rate",
    "speedup": "measured speedup",
    "predicted": "predicted speedup",
}
WIDEST_HEADLINE = "00000.0"


class Headline(QWidget):
    """The session's main figures between the token views and the charts, so that they are in
    view on any screen, however far the charts below scroll: tokens/s, plain tokens/s,
    acceptance, the measured and the predicted speedup, in one line where the width holds them
    and in two where it does not. `labels` holds each value by its name (the keys of
    `HEADLINE`); each has the tooltip of the figure it repeats."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.labels = {name: QLabel("–") for name in HEADLINE}
        self._names = {name: QLabel(name) for name in HEADLINE}
        bold = QFont()
        bold.setBold(True)
        for name, label in self.labels.items():
            label.setFont(bold)
            label.setText(WIDEST_HEADLINE)
            label.setFixedSize(label.sizeHint())  # a value that changes never relayouts the row
            label.setText("–")
            for shown in (self._names[name], label):
                shown.setToolTip(FIGURE_TIPS[HEADLINE[name]])
        self._grid = QGridLayout(self)
        self._grid.setContentsMargins(0, 0, 0, 0)
        self._grid.setVerticalSpacing(0)
        self._grid.setSizeConstraint(QGridLayout.SizeConstraint.SetNoConstraint)  # it reflows instead
        self.item_width = max(n.sizeHint().width() for n in self._names.values()) + self.labels["plain"].width() + 12
        self._columns = 0
        self._place(len(HEADLINE))

    def _place(self, columns: int) -> None:
        if columns == self._columns:
            return
        self._columns = columns
        for i, name in enumerate(self.labels):
            self._grid.addWidget(self._names[name], i // columns, 2 * (i % columns))
            self._grid.addWidget(self.labels[name], i // columns, 2 * (i % columns) + 1)

    def minimumSizeHint(self) -> QSize:
        rows = -(-len(HEADLINE) // 3)
        return QSize(3 * self.item_width, rows * self.labels["plain"].height())

    def resizeEvent(self, event) -> None:
        self._place(max(3, min(len(HEADLINE), event.size().width() // self.item_width)))
        super().resizeEvent(event)

    def show_figures(
        self, speculative: SessionSeries, plain_series: SessionSeries | None, measured: float | None
    ) -> None:
        """The speculative session's rate, acceptance and predicted speedup, the plain session's
        rate and the measured speedup of a compare run (if any)."""
        stats = speculative.stats
        plain = plain_series.stats if plain_series is not None else None
        f = self.labels
        f["tokens/s"].setText(_rate(stats.tokens_per_s) if stats.rounds else "–")
        f["plain"].setText(_rate(plain.tokens_per_s) if plain and plain.rounds else "–")
        f["acceptance"].setText(f"{stats.acceptance_rate:.2f}" if stats.drafted else "–")
        f["speedup"].setText(f"{measured:.2f}x" if measured is not None else "–")
        predicted = stats.predicted_speedup
        f["predicted"].setText(f"{predicted:.2f}x" if predicted is not None else "–")


def _plan_tooltip(plan: str) -> str:
    """The auto schedule's account of its choices (`SummaryEvent.plan`), one line per part."""
    return "Auto schedule\n" + "\n".join(plan.split("; "))


def _rate(tokens_per_s: float) -> str:
    return f"{tokens_per_s:.1f}" if tokens_per_s >= 10 else f"{tokens_per_s:.2f}"
