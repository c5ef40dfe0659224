"""The token view shows each token in the colour of its fate, and only kept text unless asked."""

from __future__ import annotations

import pytest

from app.token_view import TokenView, describe_token
from engine.events import RoundEvent, SummaryEvent, TokenEvent, TokenState

A, R, S, B, P = TokenState.ACCEPTED, TokenState.REJECTED, TokenState.RESAMPLED, TokenState.BONUS, TokenState.PLAIN


def _session() -> tuple:
    """Two rounds: 'The' 'cat' kept, 'dog' rejected then ' sat' resampled; 'on' accepted, ' mat' bonus."""
    return (
        TokenEvent(A, 1, "The", 0, 1, 0.9, 0.8),
        TokenEvent(A, 2, " cat", 1, 1, 0.7, 0.6),
        TokenEvent(R, 3, " dog", 2, 1, 0.1, 0.5),
        TokenEvent(R, 4, " ran", 2, 1, 0.05, 0.4),
        TokenEvent(S, 5, " sat", 2, 1, 0.6, 0.05),
        RoundEvent(1, 4, 2, 1.0, 2.0, 3, 0.01),
        TokenEvent(A, 6, " on", 3, 2, 0.8, 0.7),
        TokenEvent(B, 7, " mat\n", 4, 2, 0.5, None),
        TokenEvent(P, 8, "é", 5, 3, 0.5, None),
        RoundEvent(2, 1, 1, 1.0, 2.0, 6, 0.02),
    )


def test_view_holds_exactly_the_kept_text(qtbot):
    """With rejected drafts hidden, the view's text is every kept token's text, in order."""
    view = TokenView()
    qtbot.addWidget(view)
    view.show_rejected.setChecked(False)
    events = _session()
    view.add_events(events[:4])
    view.add_events(events[4:])
    assert view.shown_text() == "The cat sat on mat\né"
    assert view.kept_text() == "The cat sat on mat\né"


def test_each_token_drawn_in_its_state_colour(qtbot):
    """Accepted green, rejected red struck through before the resample, resampled orange, bonus blue, plain uncoloured."""
    view = TokenView()
    qtbot.addWidget(view)
    view.add_events(_session())
    assert view.formats() == [("The cat", A), (" dog ran", R), (" sat", S), (" on", A), (" mat", B), ("\n", None),
                              ("é", None)]


def test_rejected_drafts_only_when_shown(qtbot):
    """Unticking 'show rejected drafts' re-renders without them; ticking brings them back in place."""
    view = TokenView()
    qtbot.addWidget(view)
    view.add_events(_session())
    assert " dog" in view.shown_text()
    view.show_rejected.setChecked(False)
    assert " dog" not in view.shown_text() and all(state is not R for _, state in view.formats())
    view.show_rejected.setChecked(True)
    assert view.shown_text() == "The cat dog ran sat on mat\né"


def test_hover_finds_the_token_and_its_figures(qtbot):
    """The character under the mouse maps to its token; the tooltip states p, q and min(1, p/q)."""
    view = TokenView()
    qtbot.addWidget(view)
    view.add_events(_session())
    token = view.token_at(len("The cat d"))
    assert token.text == " dog" and token.state is R
    tip = describe_token(token)
    assert "rejected" in tip and "round 1" in tip and "position 2" in tip
    assert "min(1, p/q) = 0.2000" in tip
    view.show_rejected.setChecked(False)
    assert view.token_at(len("The cat s")).text == " sat"


def test_batches_are_drawn_together_soon_after_they_arrive(qtbot):
    """Batches that arrive in quick succession reach the screen together, without anyone reading the view."""
    view = TokenView()
    qtbot.addWidget(view)
    events = _session()
    view.add_events(events[:4])
    view.add_events(events[4:])
    document = view.text.document()
    assert document.toPlainText() == ""
    qtbot.waitUntil(lambda: document.toPlainText() == "The cat dog ran sat on mat\né", timeout=2000)
    assert view.formats()[:3] == [("The cat", A), (" dog ran", R), (" sat", S)]


def test_text_flushed_at_the_end_is_shown(qtbot):
    """Text that only the summary carries (an unfinished character flushed at the end) still appears."""
    view = TokenView()
    qtbot.addWidget(view)
    view.add_events((TokenEvent(P, 1, "ab", 0, 1, 1.0, None), RoundEvent(1, 0, 0, 0, 1, 1, 0.1)))
    view.add_events((SummaryEvent("ab\ufffd", 2, 2, 0, 0, 0, 1, 1, 1, 0, 1, (), None, "max_new_tokens"),))
    assert view.shown_text() == view.kept_text() == "ab\ufffd"


def test_tooltip_event_shows_the_hovered_token(qtbot, monkeypatch):
    """A tooltip request over a rejected draft shows that draft's figures."""
    from PySide6.QtCore import QEvent, QPoint
    from PySide6.QtGui import QHelpEvent, QTextCursor

    shown: list[str] = []
    monkeypatch.setattr("app.token_view.QToolTip.showText", lambda pos, text, widget=None: shown.append(text))
    view = TokenView()
    qtbot.addWidget(view)
    view.resize(600, 300)
    view.show()
    view.add_events(_session())
    qtbot.waitUntil(lambda: view.text.document().toPlainText() == "The cat dog ran sat on mat\né")
    cursor = QTextCursor(view.text.document())
    cursor.setPosition(len("The cat do"))
    point = view.text.cursorRect(cursor).center() + QPoint(-2, 0)
    event = QHelpEvent(QEvent.Type.ToolTip, point, view.text.viewport().mapToGlobal(point))
    view.eventFilter(view.text.viewport(), event)
    assert shown and shown[-1].startswith("rejected  ' dog'")


def test_copied_drafts_are_underlined_and_say_so(qtbot):
    """Drafts that prompt lookup copied are dotted underneath in their state's colour, and their tooltip
    names the copy; the drafter's own drafts are not underlined."""
    view = TokenView()
    qtbot.addWidget(view)
    view.add_events((
        TokenEvent(A, 1, "The", 0, 1, 0.9, 0.8),
        TokenEvent(A, 2, " cat", 1, 2, 0.7, 1.0, copied=True, source="prompt"),
        TokenEvent(R, 3, " dog", 2, 2, 0.1, 1.0, copied=True, source="prompt"),
        TokenEvent(S, 4, " sat", 2, 2, 0.6, 0.0),
    ))
    assert view.formats() == [("The", A), (" cat", A), (" dog", R), (" sat", S)]
    underlined = []
    it = view.text.document().begin().begin()
    while not it.atEnd():
        fragment = it.fragment()
        if fragment.charFormat().fontUnderline() or fragment.charFormat().underlineStyle().value:
            underlined.append(fragment.text())
        it += 1
    assert underlined == [" cat", " dog"]
    tip = describe_token(view.token_at(len("The c")))
    assert "copied from this prompt" in tip and "q (copy) = 1.0000" in tip


@pytest.mark.parametrize("source, said", [("prompt", "this prompt"), ("session", "an earlier answer this session"),
                                          ("past", "a past session")])
def test_hover_names_where_a_copied_token_came_from(source, said):
    """A copied draft's tooltip says where its text was; a model's draft and the target's own tokens say nothing of it."""
    assert f"copied from {said}" in describe_token(TokenEvent(TokenState.ACCEPTED, 7, " cat", 3, 2, 0.9, 1.0,
                                                              depth=1, source=source))
    assert "copied" not in describe_token(TokenEvent(TokenState.ACCEPTED, 7, " cat", 3, 2, 0.9, 0.6, depth=1))
    assert "copied" not in describe_token(TokenEvent(TokenState.BONUS, 8, " dog", 4, 2, 0.6, None))


def test_hover_names_a_drafts_depth():
    """A draft's tooltip says its depth in the round (a tree's alternatives are at depth 1); the
    target's own tokens carry none."""
    alternative = TokenEvent(TokenState.REJECTED, 7, " cat", 3, 2, 0.1, 0.3, depth=1)
    assert "draft depth 1" in describe_token(alternative)
    assert "depth" not in describe_token(TokenEvent(TokenState.RESAMPLED, 8, " dog", 3, 2, 0.6, 0.1))
