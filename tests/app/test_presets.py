"""The prompt presets are where a newcomer starts: each drafts on the default pair, exactly."""

import pytest

from specdeck.app.panels import load_presets
from specdeck.engine import DecodeConfig, TokenEvent
from specdeck.engine.events import SummaryEvent
from specdeck.engine.pair import PairSpec
from specdeck.engine.session import load_pair, run_session


def test_every_preset_drafts_on_the_default_pair_and_keeps_plain_text():
    """Each prompt preset the window offers, on the default pair (the built-in target and its
    feature head, the auto schedule), drafts tokens, so its Compare shows colours, and its greedy
    text equals plain decoding's."""
    pair = load_pair(PairSpec(device="cpu", backend="torch"))
    config = DecodeConfig(max_new_tokens=48)
    for name, prompt in load_presets().items():
        events = list(run_session(pair, prompt, config))
        plain = [e.token_id for e in run_session(pair, prompt, config, plain=True) if isinstance(e, TokenEvent)]
        summary = events[-1]
        assert isinstance(summary, SummaryEvent) and summary.drafted > 0, name
        assert [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept] == plain, name


def test_code_in_a_preset_keeps_its_lines(tmp_path, monkeypatch):
    """Prose lines wrapped in a preset file join into paragraphs; code, indented or inside a ```
    fence, reaches the prompt line for line (the answer's copy of it is what prompt lookup drafts)."""
    from specdeck.app import panels

    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "fix.txt").write_text(
        "Fix this\nfunction.\n\n```python\ndef f(x):\n    return x\n```\nThen explain\nit.\n\n    indented = 1\n"
    )
    monkeypatch.setattr(panels, "resource_path", lambda name: tmp_path / name)
    assert panels.load_presets()["fix"] == (
        "Fix this function.\n\n```python\ndef f(x):\n    return x\n```\nThen explain it.\n\n    indented = 1"
    )


# a combo box's popup asks for the keyboard and to be raised, which the offscreen platform cannot do
@pytest.mark.qt_log_ignore("grabbing the keyboard", "does not support raise", "propagateSizeHints")
def test_picking_the_chosen_preset_again_puts_its_prompt_back(qtbot):
    """An edited prompt goes back to the preset's text when the preset already chosen is picked
    again in its list."""
    from PySide6.QtCore import Qt

    from specdeck.app.panels import DecodingPanel

    panel = DecodingPanel()
    qtbot.addWidget(panel)
    panel.show()
    qtbot.waitExposed(panel)
    name = list(panel.presets)[1]
    panel.choose_preset(name)
    panel.prompt.setPlainText("my own edit")
    panel.preset.showPopup()
    view = panel.preset.view()
    qtbot.wait(200)
    row = view.visualRect(view.model().index(panel.preset.currentIndex(), 0))
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=row.center())
    qtbot.waitUntil(lambda: panel.prompt_text() == panel.presets[name], timeout=2000)
