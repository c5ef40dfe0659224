"""The prompt presets are where a newcomer starts: each drafts on the default pair, exactly."""

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
