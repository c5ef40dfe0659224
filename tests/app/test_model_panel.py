"""The model panel's backend choice: it builds the pair the command line builds, persists, is blamed
when it cannot serve the target, and a llama.cpp run names its backend in the figures and in Compare."""

from __future__ import annotations

import json

import pytest

from specdeck.app.model_panel import ModelPanel
from specdeck.cli.main import build_parser
from specdeck.cli.options import pair_spec
from specdeck.engine.forward.llamacpp_backend import library
from specdeck.engine.loading.registry import DEFAULT_HEAD, DEFAULT_TARGET

TIMEOUT_MS = 120_000


def _run(qtbot, window, button) -> None:
    button.click()
    qtbot.waitUntil(lambda: window.idle, timeout=TIMEOUT_MS)


def test_backend_choice_builds_the_pair_the_command_line_builds(qtbot):
    """Choosing llama.cpp in the panel gives the spec `specdeck run --backend llama.cpp` gives."""
    panel = ModelPanel()
    qtbot.addWidget(panel)
    assert panel.spec().backend == "auto"
    panel.backend.setCurrentText("llama.cpp")
    spec = panel.spec()
    assert spec.backend == "llama.cpp"
    assert pair_spec(build_parser().parse_args(["run", *spec.arguments()])) == spec


def test_backend_choice_persists_between_launches(qtbot, settings):
    """The backend chosen in one launch is chosen in the next."""
    panel = ModelPanel()
    qtbot.addWidget(panel)
    panel.backend.setCurrentText("torch")
    panel.save(settings)
    again = ModelPanel()
    qtbot.addWidget(again)
    again.restore(settings)
    assert again.spec().backend == "torch"


def test_llama_cpp_for_a_model_folder_outlines_the_backend(qtbot, window, errors):
    """llama.cpp asked for a model that is no .gguf file: the dialog says so and the backend field is outlined."""
    window.model_panel.backend.setCurrentText("llama.cpp")
    _run(qtbot, window, window.model_panel.load_button)
    assert len(errors) == 1 and ".gguf" in errors[0][1] and "--backend torch" in errors[0][1]
    panel = window.model_panel
    assert panel.backend.styleSheet() and not panel.target.combo.styleSheet()
    panel.backend.setCurrentText("auto")
    _run(qtbot, window, window.run_button)
    assert len(errors) == 1 and not panel.backend.styleSheet()
    assert window.charts.figures["backend"].text() == "float32"


@pytest.mark.skipif(library() is None, reason="llama-cpp-python is not installed (`make` builds it)")
def test_built_in_pair_on_llama_cpp_compares_and_names_its_backend(qtbot, window, errors, tmp_path):
    """The built-in GGUF on llama.cpp with its feature head: Compare gives plain's text, and the
    figures, the compare note and the exported metadata name llama.cpp and the file's weight type."""
    panel = window.model_panel
    panel.target.set_value(DEFAULT_TARGET)
    panel.drafter.setCurrentText("feature head")
    panel.draft.set_value(DEFAULT_HEAD)
    panel.backend.setCurrentText("llama.cpp")
    window.decoding_panel.schedule.setCurrentText("auto")
    window.decoding_panel.max_new_tokens.setValue(24)
    _run(qtbot, window, window.compare_button)
    assert errors == []
    speculative, plain = window.session_model.records
    assert speculative.summary.text == plain.summary.text
    assert window.charts.figures["backend"].text() == "llama.cpp Q4_1"
    note = window.verdict.text()
    assert "llama.cpp Q4_1" in note and f"{plain.summary.tokens_per_s:.1f}" in note and "identical" in note
    meta = json.loads(window.export_csv(tmp_path / "session.csv")[1].read_text(encoding="utf-8"))
    assert meta["backend"] == "llama.cpp Q4_1" and meta["versions"]["llama-cpp-python"]
    assert meta["dtype"] == "Q4_1"  # the file's own blocks, not torch's float32
