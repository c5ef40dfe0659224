"""The token view shows each token in the colour of its fate, and only kept text unless asked."""

from __future__ import annotations

import pytest

from specdeck.app.token_formats import PALETTES, state_of, token_format
from specdeck.app.token_view import LEGEND, Legend, TokenView, describe_token
from specdeck.engine.events import RoundEvent, SummaryEvent, TokenEvent, TokenState

A, R, S, B, P = TokenState.ACCEPTED, TokenState.REJECTED, TokenState.RESAMPLED, TokenState.BONUS, TokenState.PLAIN
D = TokenState.DISCARDED


def _session() -> tuple:
    """Two rounds: 'The' 'cat' kept, 'dog' rejected, 'ran' discarded, then ' sat' resampled; 'on'
    accepted, ' mat' bonus."""
    return (
        TokenEvent(A, 1, "The", 0, 1, 0.9, 0.8),
        TokenEvent(A, 2, " cat", 1, 1, 0.7, 0.6),
        TokenEvent(R, 3, " dog", 2, 1, 0.1, 0.5),
        TokenEvent(D, 4, " ran", 3, 1, 0.05, 0.4),
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


def test_each_token_drawn_in_its_state_look(qtbot):
    """Each run of text reads back (from cues other than colour) as its tokens' state: refused drafts
    before the resample, plain text as it is."""
    view = TokenView()
    qtbot.addWidget(view)
    view.add_events(_session())
    assert view.formats() == [
        ("The cat", A),
        (" dog", R),
        (" ran", D),
        (" sat", S),
        (" on", A),
        (" mat", B),
        ("\n", None),
        ("é", None),
    ]


def test_every_state_has_a_cue_besides_colour_in_both_palettes():
    """Stripped of colour, the formats of the states still differ, and read back as their state."""
    for palette in PALETTES:
        looks = {}
        for state in TokenState:
            fmt = token_format(state, palette=palette)
            assert state_of(fmt) == (None if state is P else state)
            looks[state] = (
                fmt.fontStrikeOut(),
                fmt.fontItalic(),
                fmt.fontWeight(),
                fmt.underlineStyle(),
                fmt.hasProperty(fmt.Property.BackgroundBrush),
            )
        assert len(set(looks.values())) == len(TokenState)
        copied = token_format(A, copied=True, palette=palette)
        assert state_of(copied) is A and copied.underlineStyle() == copied.UnderlineStyle.DotLine


def test_legend_shows_what_the_text_shows(qtbot):
    """Each legend entry is drawn in exactly the format the view gives tokens of that state, in
    either palette."""
    legend = Legend()
    qtbot.addWidget(legend)
    for palette in PALETTES:
        legend.refresh(palette)
        view = TokenView()
        qtbot.addWidget(view)
        view.set_palette(palette)
        for (label, fmt), (state, copied, name, _) in zip(legend.entries(), LEGEND, strict=True):
            view.clear()
            view.add_events((TokenEvent(state, 1, "x", 0, 1, 0.5, 0.5, copied=copied),))
            view.formats()
            drawn = view.text.document().begin().begin().fragment().charFormat()
            assert label == name and fmt == drawn, (palette, name)
    assert "discarded" in legend.toolTip() and "never judged" in legend.toolTip()


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
    view.show_rejected.setChecked(False)
    assert all(state not in (R, D) for _, state in view.formats())


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
    assert view.formats()[:4] == [("The cat", A), (" dog", R), (" ran", D), (" sat", S)]


def test_text_flushed_at_the_end_is_shown(qtbot):
    """Text that only the summary carries (a character held back with an unfinished one after it,
    flushed at the end without that one) still appears."""
    view = TokenView()
    qtbot.addWidget(view)
    view.add_events((TokenEvent(P, 1, "ab", 0, 1, 1.0, None), RoundEvent(1, 0, 0, 0, 1, 1, 0.1)))
    view.add_events((SummaryEvent("abé", 2, 2, 0, 0, 0, 1, 1, 1, 0, 1, (), None, "max_new_tokens"),))
    assert view.shown_text() == view.kept_text() == "abé"


def test_tooltip_event_shows_the_hovered_token(qtbot, monkeypatch):
    """A tooltip request over a rejected draft shows that draft's figures."""
    from PySide6.QtCore import QEvent, QPoint
    from PySide6.QtGui import QHelpEvent, QTextCursor

    shown: list[str] = []
    monkeypatch.setattr("specdeck.app.token_view.QToolTip.showText", lambda pos, text, widget=None: shown.append(text))
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
    view.add_events(
        (
            TokenEvent(A, 1, "The", 0, 1, 0.9, 0.8),
            TokenEvent(A, 2, " cat", 1, 2, 0.7, 1.0, copied=True, source="prompt"),
            TokenEvent(R, 3, " dog", 2, 2, 0.1, 1.0, copied=True, source="prompt"),
            TokenEvent(S, 4, " sat", 2, 2, 0.6, 0.0),
        )
    )
    assert view.formats() == [("The", A), (" cat", A), (" dog", R), (" sat", S)]
    underlined = []
    it = view.text.document().begin().begin()
    while not it.atEnd():
        fragment = it.fragment()
        if fragment.charFormat().underlineStyle() == fragment.charFormat().UnderlineStyle.DotLine:
            underlined.append(fragment.text())
        it += 1
    assert underlined == [" cat", " dog"]
    tip = describe_token(view.token_at(len("The c")))
    assert "copied from this prompt" in tip and "q (copy) = 1.0000" in tip


@pytest.mark.parametrize(
    "source, said",
    [
        ("prompt", "this prompt"),
        ("session", "an earlier answer this session"),
        ("texts", "the target's own earlier texts"),
        ("past", "a past session"),
    ],
)
def test_hover_names_where_a_copied_token_came_from(source, said):
    """A copied draft's tooltip says where its text was; a model's draft and the target's own tokens say nothing of it."""
    assert f"copied from {said}" in describe_token(
        TokenEvent(TokenState.ACCEPTED, 7, " cat", 3, 2, 0.9, 1.0, depth=1, source=source)
    )
    assert "copied" not in describe_token(TokenEvent(TokenState.ACCEPTED, 7, " cat", 3, 2, 0.9, 0.6, depth=1))
    assert "copied" not in describe_token(TokenEvent(TokenState.BONUS, 8, " dog", 4, 2, 0.6, None))


def test_hover_names_a_drafts_depth():
    """A draft's tooltip says its depth in the round (a tree's alternatives are at depth 1); the
    target's own tokens carry none."""
    alternative = TokenEvent(TokenState.REJECTED, 7, " cat", 3, 2, 0.1, 0.3, depth=1)
    assert "draft depth 1" in describe_token(alternative)
    assert "depth" not in describe_token(TokenEvent(TokenState.RESAMPLED, 8, " dog", 3, 2, 0.6, 0.1))


def test_tooltips_show_min_p_over_q_only_for_judged_drafts():
    """A resampled token's or a discarded draft's tooltip has no min(1, p/q) (the rule did not
    judge them) and says what they are instead."""
    resampled = describe_token(TokenEvent(S, 8, " dog", 3, 2, 0.6, 0.0))
    assert "min(1, p/q)" not in resampled and "q (draft)" not in resampled and "in place of" in resampled
    discarded = describe_token(TokenEvent(D, 9, " cat", 4, 2, 0.2, 0.5, depth=2))
    assert "min(1, p/q)" not in discarded and "never judged" in discarded
