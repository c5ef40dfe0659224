"""The live token view: every token of a session drawn as its fate, in the looks of
`token_formats` (a second cue beside each colour, two palettes).

The legend is drawn with the very formats the view uses. The view keeps every `TokenEvent` so
that hiding or showing refused drafts re-renders it, and so that hovering a token can show its
state, position, round, p, q and, for judged drafts, min(1, p/q) (a sampled tree's alternative: its
chance against the residual).
"""

from __future__ import annotations

import bisect

from PySide6.QtCore import QEvent, Qt, QTimer
from PySide6.QtGui import QColor, QFont, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QCheckBox, QHBoxLayout, QLabel, QPlainTextEdit, QToolTip, QVBoxLayout, QWidget

from specdeck.app.session_model import SessionModel
from specdeck.app.token_formats import REFUSED, document_formats, state_of, token_format
from specdeck.engine.events import SummaryEvent, TokenEvent, TokenState
from specdeck.engine.export import SessionRecord

RENDER_INTERVAL_MS = 50
LEGEND_SEPARATOR = " · "

LEGEND = (  # (state, copied, label, what it means)
    (TokenState.ACCEPTED, False, "accepted", "A draft the target accepted: kept"),
    (TokenState.REJECTED, False, "rejected", "The draft the target refused, where it was proposed: not kept"),
    (
        TokenState.DISCARDED,
        False,
        "discarded",
        "Drafts after the rejected one in the same round, or a sampled tree's alternatives left untried: never "
        "judged, not kept (not counted in acceptance by depth)",
    ),
    (TokenState.RESAMPLED, False, "resampled", "The target's token in place of the rejected draft"),
    (TokenState.BONUS, False, "bonus", "Every draft passed: the target's next token came free from the same forward"),
    (
        TokenState.PLAIN,
        False,
        "plain",
        "The target's own token, no draft judged: plain decoding, or a served target's continuation after "
        "the round's own token",
    ),
    (
        TokenState.ACCEPTED,
        True,
        "copied",
        "A draft prompt lookup copied from earlier text (Lookup > 0), shown in "
        "its state's look (here accepted) and dotted underneath",
    ),
)


_FORMATS: dict[tuple[TokenState, bool, str], QTextCharFormat] = {}  # made once each


def _format(state: TokenState, copied: bool = False, palette: str = "standard") -> QTextCharFormat:
    if (state, copied, palette) not in _FORMATS:
        _FORMATS[state, copied, palette] = token_format(state, copied, palette)
    return _FORMATS[state, copied, palette]


SOURCES = {
    "prompt": "this prompt",
    "session": "an earlier answer this session",
    "texts": "the target's own earlier texts",
    "past": "a past session",
}


def describe_token(event: TokenEvent) -> str:
    """A token's tooltip: its state, where it stands, and the figures that mean something for it."""
    where = f"position {event.pos}, round {event.round}" + (f", draft depth {event.depth}" if event.depth else "")
    lines = [f"{event.state.value}  {event.text!r}", where, f"p (target) = {event.p:.4f}"]
    if event.source:
        lines.append(f"copied from {SOURCES.get(event.source, event.source)}")
    source = "copy" if event.copied else "draft"
    if event.state.judged and event.q is not None:
        lines.append(f"q ({source}) = {event.q:.4f}")
        if event.chance is not None:  # a sampled tree's alternative, tried after the first draft was refused
            lines.append(f"chance against the residual = {event.chance:.4f}")
        else:
            lines.append(f"min(1, p/q) = {event.acceptance_probability:.4f}")
    elif event.state is TokenState.DISCARDED:
        lines.append(f"q ({source}) = {event.q:.4f}" if event.q is not None else "")
        if event.depth == 1:  # only a tree's alternative is discarded beside the first draft
            lines.append("never judged: the first draft, or an alternative tried before it, was accepted")
        else:
            lines.append("never judged: an earlier draft of this round was rejected")
    elif event.state is TokenState.RESAMPLED:
        lines.append(
            "the target's token in place of the rejected draft: drawn from max(0, p - q), normalised "
            "(greedy: the target's top token)"
        )
    elif event.state is TokenState.BONUS:
        lines.append("every draft passed: the target's next token, from the same forward")
    if event.draft_tokens:  # a draft with a tokenizer of its own: what it wrote, in its tokens
        written = "  ".join(f"{text!r} (q {q:.4f})" for text, q in zip(event.draft_tokens, event.draft_q))
        lines.append(f"the draft wrote, in its own tokens: {written}")
    return "\n".join(line for line in lines if line)


class Legend(QPlainTextEdit):
    """The key to the token view, drawn with the view's own formats; hover an entry for its meaning."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setFrameShape(QPlainTextEdit.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.NoTextInteraction)
        self.setFont(QFont("DejaVu Sans Mono", 10))
        self.viewport().setAutoFillBackground(False)
        self.setStyleSheet("QPlainTextEdit { background: transparent; }")
        self.setToolTip("\n".join(f"{label}: {meaning}" for _, _, label, meaning in LEGEND))
        self.palette_name = "standard"
        self.refresh()

    def refresh(self, palette: str | None = None) -> None:
        self.palette_name = palette or self.palette_name
        self.clear()
        cursor = QTextCursor(self.document())
        separator = QTextCharFormat()
        separator.setForeground(QColor("#999999"))  # never merged with the plain entry's empty format
        for i, (state, copied, label, _) in enumerate(LEGEND):
            if i:
                cursor.insertText(LEGEND_SEPARATOR, separator)
            cursor.insertText(label, _format(state, copied, self.palette_name))
        width = self.fontMetrics().horizontalAdvance(self.toPlainText()) + 12
        self.setFixedSize(width, self.fontMetrics().height() + 10)

    def entries(self) -> list[tuple[str, QTextCharFormat]]:
        """(label, format) of each entry, as drawn."""
        return [(text, fmt) for text, fmt in document_formats(self.document()) if text != LEGEND_SEPARATOR]


class TokenView(QWidget):
    """A read-only text view fed with event batches (`add_events`); `clear` starts a new session.

    Given a `SessionModel`, it follows the sessions of `mode` ("speculative" or "plain") that the
    model's runs hold; a plain view shows only in compare runs."""

    def __init__(
        self,
        title: str = "",
        model: SessionModel | None = None,
        mode: str = "speculative",
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.mode = mode
        self.title = QLabel(f"<b>{title}</b>")
        self.palette_name = "standard"
        self.show_rejected = QCheckBox("Show rejected drafts")
        self.show_rejected.setToolTip(
            "Show the drafts the target refused, and the discarded ones after them, where they were proposed"
        )
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
        header = QHBoxLayout()  # the title and the show-rejected box: one short line at any width
        header.addWidget(self.title)
        header.addStretch(1)
        header.addWidget(self.show_rejected)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(header)
        layout.addWidget(self.text, 1)
        self.clear()
        if mode == "plain":
            self.show_rejected.hide()  # plain decoding drafts nothing
            self.hide()
        if model is not None:
            model.run_started.connect(self._on_run_started)
            model.events_arrived.connect(self._on_events_arrived)

    def _on_run_started(self, compare: bool) -> None:
        self.clear()
        if self.mode == "plain":
            self.setVisible(compare)

    def _on_events_arrived(self, record: SessionRecord, batch: tuple) -> None:
        if record.mode == self.mode:
            self.add_events(batch)

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
                    self._tail = event.text[len(kept) :]
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
            if event.state in REFUSED and not show:
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
        cursor.insertText(text, _format(state, copied, self.palette_name))
        self._length += len(text)

    def _insert(self, text: str, state: TokenState) -> None:
        cursor = QTextCursor(self.text.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        self._write(cursor, text, state)

    def set_palette(self, palette: str) -> None:
        """Draw with another palette (`specdeck.app.token_formats.PALETTES`): the whole session again."""
        self.palette_name = palette
        self._on_show_rejected_toggled(self.show_rejected.isChecked())

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

    def eventFilter(self, watched, event) -> bool:
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
        return [(text, None if text == "\n" else state_of(fmt)) for text, fmt in document_formats(self.text.document())]
