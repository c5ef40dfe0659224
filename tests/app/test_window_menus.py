"""The keyboard: shortcuts to run, compare, stop, export and reach the prompt; Tab leaves the prompt."""

from __future__ import annotations

from PySide6.QtCore import Qt

TIMEOUT_MS = 60_000
CTRL = Qt.KeyboardModifier.ControlModifier


def _focus(qtbot, widget) -> None:
    widget.window().activateWindow()
    widget.setFocus()
    qtbot.waitUntil(widget.hasFocus, timeout=2000)


def test_ctrl_enter_in_the_prompt_runs_and_escape_stops(qtbot, window, errors):
    """Ctrl+Enter typed in the prompt starts a session; Esc stops it, keeping its text."""
    window.decoding_panel.max_new_tokens.setValue(4000)
    _focus(qtbot, window.decoding_panel.prompt)
    prompt = window.decoding_panel.prompt_text()
    qtbot.keyClick(window.decoding_panel.prompt, Qt.Key.Key_Return, CTRL)
    qtbot.waitUntil(lambda: len(window.speculative_view.tokens) > 10, timeout=TIMEOUT_MS)
    assert window.decoding_panel.prompt_text() == prompt  # no newline typed
    _focus(qtbot, window.decoding_panel.prompt)  # back from the loading dialog
    qtbot.keyClick(window.decoding_panel.prompt, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: window.idle, timeout=TIMEOUT_MS)
    summary = window.session_model.records[0].summary
    assert errors == [] and summary.stop_reason == "cancelled" and summary.new_tokens < 4000


def test_ctrl_shift_enter_compares(qtbot, window, errors):
    """Ctrl+Shift+Enter runs a compare: both sessions, both views."""
    _focus(qtbot, window.decoding_panel.k)
    qtbot.keyClick(window.decoding_panel.k, Qt.Key.Key_Return, CTRL | Qt.KeyboardModifier.ShiftModifier)
    qtbot.waitUntil(lambda: window.idle and len(window.session_model.records) == 2, timeout=TIMEOUT_MS)
    assert errors == [] and [r.mode for r in window.session_model.records] == ["speculative", "plain"]


def test_ctrl_e_exports_while_a_spin_box_has_the_focus(qtbot, window, tmp_path, monkeypatch):
    """Ctrl+E opens the export even where a field would take the key for itself (end of line)."""
    window.run_button.click()
    qtbot.waitUntil(lambda: window.idle, timeout=TIMEOUT_MS)
    asked = []
    monkeypatch.setattr(
        "specdeck.app.main_window.QFileDialog.getSaveFileName",
        lambda *a, **k: asked.append(1) or (str(tmp_path / "run.csv"), ""),
    )
    _focus(qtbot, window.decoding_panel.seed)
    qtbot.keyClick(window.decoding_panel.seed, Qt.Key.Key_E, CTRL)
    assert asked and (tmp_path / "run.csv").exists()


def test_tab_leaves_the_prompt_and_ctrl_tab_types_a_tab(qtbot, window):
    """Tab moves the focus out of the prompt without changing it; Ctrl+Tab inserts a tab character;
    Ctrl+L brings the focus back."""
    prompt = window.decoding_panel.prompt
    _focus(qtbot, prompt)
    before = prompt.toPlainText()
    qtbot.keyClick(prompt, Qt.Key.Key_Tab)
    assert not prompt.hasFocus() and prompt.toPlainText() == before
    qtbot.keyClick(window.focusWidget(), Qt.Key.Key_L, CTRL)
    assert prompt.hasFocus()
    qtbot.keyClick(prompt, Qt.Key.Key_Tab, CTRL)
    assert prompt.toPlainText().count("\t") == before.count("\t") + 1 and prompt.hasFocus()


def test_help_lists_the_shortcuts(qtbot, window):
    """Help > Keyboard shortcuts names each action's keys."""
    rows = dict((what, keys) for keys, what in window.menus.shortcut_list())
    for what in ("Run", "Compare", "Stop", "Export CSV", "Focus the prompt", "Settings panel"):
        assert rows.get(what), what
    assert "Esc" in rows["Stop"] and "Ctrl+E" in rows["Export CSV"]
