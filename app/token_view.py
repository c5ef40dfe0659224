"""The live token view: every token of a session in the colour of its fate.

Accepted drafts green, rejected drafts red and struck through where they were proposed (before
the target's replacement), resampled tokens orange, bonus tokens blue, plain tokens uncoloured;
drafts that prompt lookup copied from earlier text are dotted underneath. The view keeps every
`TokenEvent` so that hiding or showing rejected drafts re-renders it, and so that hovering a token can show its state, position, round, p, q and min(1, p/q).
"""

from __future__ import annotations

import bisect

from PySide6.QtCore import QEvent, QTimer
from PySide6.QtGui import QColor, QFont, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QCheckBox, QHBoxLayout, QLabel, QPlainTextEdit, QToolTip, QVBoxLayout, QWidget

from engine.events import SummaryEvent, TokenEvent, TokenState

RENDER_INTERVAL_MS = 50

STATE_COLOURS = {
    TokenState.ACCEPTED: QColor("#1b8a2f"),
    TokenState.REJECTED: QColor("#c62828"),
    TokenState.RESAMPLED: QColor("#e07000"),
    TokenState.BONUS: QColor("#1f5fd1"),
}


def token_format(state: TokenState, copied: bool = False) -> QTextCharFormat:
    """The look of a token: its state's colour; rejected struck through; a copy by prompt lookup
    (rather than the drafter's own guess) dotted underneath."""
    fmt = QTextCharFormat()
    if copied:
        fmt.setUnderlineStyle(QTextCharFormat.UnderlineStyle.DotLine)
    if state in STATE_COLOURS:
        fmt.setForeground(STATE_COLOURS[state])
    if state is TokenState.REJECTED:
        fmt.setFontStrikeOut(True)
        background = QColor(STATE_COLOURS[state])
        background.setAlpha(28)
        fmt.setBackground(background)
    return fmt


_FORMATS: dict[tuple[TokenState, bool], QTextCharFormat] = {}


def _format(state: TokenState, copied: bool = False) -> QTextCharFormat:
    if (state, copied) not in _FORMATS:
        _FORMATS[state, copied] = token_format(state, copied)
    return _FORMATS[state, copied]


SOURCES = {"prompt": "this prompt", "session": "an earlier answer this session", "past": "a past session"}


def describe_token(event: TokenEvent) -> str:
    where = f"position {event.pos}, round {event.round}" + (f", draft depth {event.depth}" if event.depth else "")
    lines = [f"{event.state.value}  {event.text!r}", where, f"p (target) = {event.p:.4f}"]
    if event.source:
        lines.append(f"copied from {SOURCES.get(event.source, event.source)}")
    if event.q is not None:
        lines.append(f"q ({'copy' if event.copied else 'draft'}) = {event.q:.4f}")
        lines.append(f"min(1, p/q) = {event.acceptance_probability:.4f}")
    return "\n".join(lines)


class Legend(QWidget):
    """The colour key, in the same formats as the view."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for state in TokenState:
            label = QLabel(state.value)
            colour = STATE_COLOURS.get(state)
            style = f"color: {colour.name()};" if colour else ""
            if state is TokenState.REJECTED:
                style += "text-decoration: line-through;"
            label.setStyleSheet(style + "font-weight: bold;")
            layout.addWidget(label)
        copied = QLabel("copied")
        copied.setStyleSheet("text-decoration: underline; font-weight: bold;")
        copied.setToolTip("Drafts that prompt lookup copied from earlier text (Lookup > 0) are underlined")
        layout.addWidget(copied)
        layout.addStretch(1)


class TokenView(QWidget):
    """A read-only text view fed with event batches (`add_events`); `clear` starts a new session."""

    def __init__(self, title: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.title = QLabel(f"<b>{title}</b>")
        self.show_rejected = QCheckBox("Show rejected drafts")
        self.show_rejected.setChecked(True)
        self.show_rejected.toggled.connect(self._on_show_rejected_toggled)
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setUndoRedoEnabled(False)
        self.text.setFont(QFont("DejaVu Sans Mono", 10))
        self.text.setMouseTracking(True)
        self.text.viewport().installEventFilter(self)
        # batches arrive every ~25 ms; rendering at most this often keeps the view's repaints (a
        # whole viewport each time it scrolls) fewer than the batches, however fast tokens come
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(RENDER_INTERVAL_MS)
        self._render_timer.timeout.connect(self._flush)
        header = QHBoxLayout()
        header.addWidget(self.title)
        header.addStretch(1)
        header.addWidget(self.show_rejected)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(header)
        layout.addWidget(self.text, 1)
        self.clear()

    def clear(self) -> None:
        self.tokens: list[TokenEvent] = []
        self._kept_pieces: list[str] = []  # each kept token's text, in order: the session's text grows here
        self.summary: SummaryEvent | None = None
        self._tail = ""  # text the session flushed at its end that no token event carried
        self._span_starts: list[int] = []  # document position where each shown token starts
        self._span_tokens: list[int] = []  # index into self.tokens of each shown token
        self._length = 0
        self._rendered = 0  # tokens[:_rendered] are in the document
        self._render_timer.stop()
        self.text.clear()

    # feeding --------------------------------------------------------------------------------------

    def add_events(self, batch: tuple) -> None:
        """Take a batch's token events; the document catches up within `RENDER_INTERVAL_MS`, in one
        insertion per run of the same state, or at once when the session ends or the view is read."""
        new = [e for e in batch if isinstance(e, TokenEvent)]
        self.tokens.extend(new)
        self._kept_pieces.extend(e.text for e in new if e.state.kept)
        if new and not self._render_timer.isActive():
            self._render_timer.start()
        for event in batch:
            if isinstance(event, SummaryEvent):
                self.summary = event
                self._flush()
                kept = self.kept_text()
                if event.text.startswith(kept) and len(event.text) > len(kept):
                    self._tail = event.text[len(kept):]
                    self._insert(self._tail, TokenState.PLAIN)

    def _flush(self) -> None:
        """Draw the tokens that arrived since the last render."""
        self._render_timer.stop()
        if self._rendered < len(self.tokens):
            self._render(self._rendered)

    def _render(self, first: int) -> None:
        """Append tokens[first:]; a view scrolled to its end follows the new text."""
        bar = self.text.verticalScrollBar()
        following = bar.value() >= bar.maximum() - 2
        show = self.show_rejected.isChecked()
        cursor = QTextCursor(self.text.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.beginEditBlock()
        run_look, run_text, run_length = None, [], 0
        for index in range(first, len(self.tokens)):
            event = self.tokens[index]
            if event.state is TokenState.REJECTED and not show:
                continue
            look = (event.state, event.copied)
            if look != run_look and run_text:
                self._write(cursor, "".join(run_text), *run_look)
                run_text, run_length = [], 0
            run_look = look
            self._span_starts.append(self._length + run_length)
            self._span_tokens.append(index)
            run_text.append(event.text)
            run_length += len(event.text)
        if run_text:
            self._write(cursor, "".join(run_text), *run_look)
        cursor.endEditBlock()
        self._rendered = len(self.tokens)
        if following:
            bar.setValue(bar.maximum())

    def _write(self, cursor: QTextCursor, text: str, state: TokenState, copied: bool = False) -> None:
        cursor.insertText(text, _format(state, copied))
        self._length += len(text)

    def _insert(self, text: str, state: TokenState) -> None:
        cursor = QTextCursor(self.text.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        self._write(cursor, text, state)

    def _on_show_rejected_toggled(self, _checked: bool) -> None:
        self._render_timer.stop()
        self._span_starts, self._span_tokens, self._length = [], [], 0
        self.text.clear()
        self._render(0)
        if self._tail:
            self._insert(self._tail, TokenState.PLAIN)

    # reading --------------------------------------------------------------------------------------

    def kept_text(self) -> str:
        """The session's text: every kept token's piece, in order."""
        return "".join(self._kept_pieces) + self._tail

    def shown_text(self) -> str:
        self._flush()
        return self.text.document().toRawText().replace("\u2029", "\n")

    def token_at(self, position: int) -> TokenEvent | None:
        """The token whose text covers document position `position`."""
        self._flush()
        i = bisect.bisect_right(self._span_starts, position) - 1
        if i < 0:
            return None
        event = self.tokens[self._span_tokens[i]]
        if position >= self._span_starts[i] + len(event.text):
            return None
        return event

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt override
        if event.type() == QEvent.Type.ToolTip:
            cursor = self.text.cursorForPosition(event.pos())
            rect = self.text.cursorRect(cursor)
            # the cursor lands between characters: the one under the mouse is left of it or right
            position = cursor.position() - (1 if event.pos().x() < rect.x() else 0)
            token = self.token_at(position)
            if token is not None and abs(rect.center().y() - event.pos().y()) <= rect.height():
                QToolTip.showText(event.globalPos(), describe_token(token), self.text)
            else:
                QToolTip.hideText()
            return True
        return super().eventFilter(watched, event)

    def formats(self) -> list[tuple[str, TokenState | None]]:
        """(text, state) for each run of characters of one format, as drawn: what a test reads."""
        self._flush()
        runs: list[tuple[str, TokenState | None]] = []
        block = self.text.document().begin()
        while block.isValid():
            it = block.begin()
            while not it.atEnd():
                fragment = it.fragment()
                runs.append((fragment.text(), state_of(fragment.charFormat())))
                it += 1
            block = block.next()
            if block.isValid():
                runs.append(("\n", None))
        return runs


def state_of(fmt: QTextCharFormat) -> TokenState | None:
    """The state a character format draws, or None for uncoloured text."""
    if fmt.fontStrikeOut():
        return TokenState.REJECTED
    if fmt.hasProperty(QTextCharFormat.Property.ForegroundBrush):
        colour = fmt.foreground().color()
        for state, known in STATE_COLOURS.items():
            if known == colour:
                return state
    return None
