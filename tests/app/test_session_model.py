"""The window's Qt-free model: which field of the model panel a failed load blames."""

from __future__ import annotations

from specdeck.app.session_model import blamed_field
from specdeck.engine.loading.hub import hub_message
from specdeck.engine.loading.registry import DEFAULT_HEAD
from specdeck.engine.pair import DrafterKind, PairSpec


def test_an_unknown_hugging_face_target_is_blamed_on_target_even_where_the_message_lists_the_draft():
    """The Hub's "not reachable" and "no such model" messages name the target quoted; the built-in
    models they list (the draft's among them) do not move the blame to Draft."""
    spec = PairSpec("no-owner/no-such-model", DEFAULT_HEAD, DrafterKind.FEATURE_HEAD)
    offline = OSError("could not reach the Hub")
    offline.__cause__ = ConnectionError()
    for message in (
        hub_message(spec.target, offline),
        f"There is no model {spec.target!r} on the Hugging Face Hub: check the spelling.",
    ):
        assert DEFAULT_HEAD in message or "no model" in message
        assert blamed_field(spec, message) == "target", message


def test_a_message_about_the_draft_blames_the_draft():
    """A message quoting the draft, or about vocabularies, blames Draft."""
    spec = PairSpec("smollm2-135m-instruct", "no-owner/no-draft", DrafterKind.DRAFT_MODEL)
    assert blamed_field(spec, f"There is no model {spec.draft!r} on the Hugging Face Hub.") == "draft"
    assert blamed_field(spec, "The two vocabularies share no token.") == "draft"


def test_a_drafter_other_than_the_one_shown_is_said_in_the_model_panel(qtbot):
    """Left to its default, the built-in target's drafter follows what runs it: where another
    drafter loaded than the panel shows, the panel's "Loaded:" line says which and why."""
    from specdeck.app.model_panel import ModelPanel
    from specdeck.app.session_model import SessionModel
    from specdeck.app.worker import PairInfo

    model = SessionModel()
    panel = ModelPanel(model)
    qtbot.addWidget(panel)
    assert panel.drafter_kind is DrafterKind.FEATURE_HEAD
    runs = "llama.cpp Q4_K_M"
    info = PairInfo("target x + suffix", "x", None, "suffix", "cpu", "Q4_K_M", backend=runs)
    model.set_loaded(panel.spec(), info)
    shown = panel.loaded.text()
    assert "suffix drafts, not the feature head shown" in shown and runs in shown
    model.set_loaded(panel.spec(), PairInfo("target x + head", "x", DEFAULT_HEAD, "feature-head", "cpu", "float32"))
    assert "<br>" not in panel.loaded.text()
