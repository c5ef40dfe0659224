"""How the Benchmark tab (`specdeck.app.bench_tab`) shows a benchmark's results: the summary table, in
summary.csv's columns with words for headers, and each plot the harness drew as a picture that
fits its page.

Widgets of their own, apart from the tab's options and run control, so that the tab reads as what
it runs and these as what it shows; they only draw what they are given.
"""

from __future__ import annotations

from PySide6.QtCore import QRect, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QPainter, QPixmap
from PySide6.QtWidgets import QAbstractItemView, QSizePolicy, QTableWidget, QTableWidgetItem, QWidget

from specdeck.bench.tables import SUMMARY_COLUMNS

IDENTICAL_COLOURS = {"true": "#1b8a2f", "false": "#c62828"}


def readable_header(column: str) -> str:
    """A summary.csv column as a table header: words, in two lines when long."""
    words = column.replace("_", " ")
    if len(words) <= 10 or " " not in words:
        return words
    middle = len(words) // 2
    cut = min((i for i, c in enumerate(words) if c == " "), key=lambda i: abs(i - middle))
    return words[:cut] + "\n" + words[cut + 1 :]


class SummaryTable(QTableWidget):
    """summary.csv as a read-only table: each header names its column in its tooltip, greedy
    outputs identical to plain (or not) in colour, the `all` rows in bold."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(0, len(SUMMARY_COLUMNS), parent)
        for column, name in enumerate(SUMMARY_COLUMNS):
            header = QTableWidgetItem(readable_header(name))
            header.setToolTip(f"{name} in summary.csv")
            self.setHorizontalHeaderItem(column, header)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.verticalHeader().hide()

    def show_rows(self, summary: list[dict]) -> None:
        """One row per summary.csv row, columns sized to their contents."""
        self.setRowCount(len(summary))
        bold = QFont()
        bold.setBold(True)
        for row, values in enumerate(summary):
            for column, name in enumerate(SUMMARY_COLUMNS):
                item = QTableWidgetItem(str(values[name]))
                if name == "identical_to_plain" and values[name] in IDENTICAL_COLOURS:
                    item.setForeground(QBrush(QColor(IDENTICAL_COLOURS[values[name]])))
                if values["category"] == "all":
                    item.setFont(bold)
                self.setItem(row, column, item)
        self.resizeColumnsToContents()


class PlotImage(QWidget):
    """A PNG drawn as large as the widget allows, keeping its proportions (the plots are wider than tall)."""

    def __init__(self, name: str, data: bytes, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.name = name
        self.pixmap = QPixmap()
        self.pixmap.loadFromData(data, "PNG")
        self.setToolTip(name)
        self.setMinimumSize(160, 80)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)

    def sizeHint(self) -> QSize:
        return self.pixmap.size()

    def paintEvent(self, event) -> None:
        if self.pixmap.isNull():
            return
        size = self.pixmap.size().scaled(self.size(), Qt.AspectRatioMode.KeepAspectRatio)
        area = QRect(
            (self.width() - size.width()) // 2, (self.height() - size.height()) // 2, size.width(), size.height()
        )
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
        painter.drawPixmap(area, self.pixmap)
        painter.end()
