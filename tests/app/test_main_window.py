"""The window end to end with a tiny model pair: sessions, compare, stop, errors, closing."""

from __future__ import annotations

import asyncio
import time

from specdeck.engine.events import TokenEvent, TokenState

TIMEOUT_MS = 60_000


def _run(qtbot, window, button) -> None:
    button.click()
    qtbot.waitUntil(lambda: window.idle, timeout=TIMEOUT_MS)


def test_session_view_shows_the_kept_text_in_its_colours(qtbot, window, errors):
    """After a run the view holds exactly the summary's text, and each token's colour matches its event."""
    _run(qtbot, window, window.run_button)
    assert errors == []
    record = window.session_model.records[0]
    view = window.speculative_view
    assert record.summary is not None and record.summary.new_tokens > 0
    view.show_rejected.setChecked(False)
    assert view.shown_text() == view.kept_text() == record.summary.text
    drawn = "".join(text for text, state in view.formats() if state is TokenState.ACCEPTED)
    assert drawn == "".join(e.text for e in record.tokens if e.state is TokenState.ACCEPTED).replace("\n", "")
    states = {e.state for e in record.tokens}
    assert TokenState.ACCEPTED in states and (TokenState.RESAMPLED in states or TokenState.BONUS in states)


def test_charts_match_the_session_statistics(qtbot, window):
    """The charts' buffers give the summary's acceptance rate, per-position acceptance, rounds and tokens."""
    _run(qtbot, window, window.run_button)
    summary = window.session_model.records[0].summary
    series = window.charts.speculative
    assert series.size == summary.rounds
    assert abs(series.cumulative_acceptance[-1] - summary.acceptance_rate) < 1e-12
    assert series.column("accepted").sum() == summary.accepted
    lengths, counts = series.kept_histogram()
    assert counts.sum() == summary.rounds
    assert (lengths * counts).sum() == summary.new_tokens
    assert series.stats.accepted_by_position == summary.accepted_by_position
    assert abs(series.tokens_per_s[-1] - summary.tokens_per_s) < 1e-9
    assert window.charts.figures["rounds"].text() == str(summary.rounds)
    copied = f"{summary.copied_accepted}/{summary.copied_drafted} accepted" if summary.copied_drafted else "–"
    assert window.charts.figures["copied drafts"].text() == copied


def test_compare_fills_both_views_and_marks_greedy_runs_identical(qtbot, window, errors):
    """Compare runs speculative then plain; greedy outputs are equal and the window says so."""
    _run(qtbot, window, window.compare_button)
    assert errors == []
    speculative, plain = window.session_model.records
    assert (speculative.mode, plain.mode) == ("speculative", "plain")
    assert all(e.state is TokenState.PLAIN for e in plain.tokens)
    assert window.plain_view.kept_text() == plain.summary.text == speculative.summary.text
    assert window.speculative_view.kept_text() == speculative.summary.text
    assert window.charts.identical is True
    assert "identical" in window.verdict.text()
    assert window.charts.plain.size == plain.summary.rounds
    headline = window.charts.headline.labels  # the figures in view above the charts
    assert headline["tokens/s"].text() == window.charts.figures["tokens/s"].text() != "–"
    assert headline["speedup"].text() == f"{speculative.summary.tokens_per_s / plain.summary.tokens_per_s:.2f}x"


def test_stop_mid_run_keeps_the_text(qtbot, window, monkeypatch):
    """Stop ends the session within a round; what was generated stays in the view. After its first
    ten tokens the session is slowed down until Stop, so that a test process beside a busy machine
    still clicks Stop before the tiny target reaches the end of its context."""
    from specdeck.engine import session

    def slowed_after_ten_tokens(target, prompt_ids, config, drafter=None, cancel=None):
        tokens = 0
        for event in real_generate(target, prompt_ids, config, drafter, cancel):
            yield event
            tokens += isinstance(event, TokenEvent)
            if tokens > 10 and cancel is not None and not cancel.is_set():
                time.sleep(0.02)

    real_generate = session.generate
    monkeypatch.setattr(session, "generate", slowed_after_ten_tokens)
    window.decoding_panel.max_new_tokens.setValue(4000)
    window.run_button.click()
    qtbot.waitUntil(lambda: len(window.speculative_view.tokens) > 10, timeout=TIMEOUT_MS)
    window.stop_button.click()
    qtbot.waitUntil(lambda: window.idle, timeout=TIMEOUT_MS)
    summary = window.session_model.records[0].summary
    assert summary.stop_reason == "cancelled"
    assert 0 < summary.new_tokens < 4000
    assert window.speculative_view.kept_text() == summary.text
    assert f"Stopped</b> after {summary.new_tokens} tokens" in window.verdict.text()


def test_bad_model_path_gives_a_dialog_and_the_window_still_works(qtbot, window, errors, tmp_path):
    """A missing model folder is reported in a dialog; fixing it, the next run succeeds."""
    good = window.model_panel.target.value
    window.model_panel.target.set_value(str(tmp_path / "no-such-model"))
    _run(qtbot, window, window.model_panel.load_button)
    assert len(errors) == 1 and "no-such-model" in errors[0][1] and "does not exist" in errors[0][1]
    panel = window.model_panel
    assert "Load failed" in panel.loaded.text() and "Loaded:" not in panel.loaded.text()
    assert panel.target.combo.styleSheet() and not panel.draft.combo.styleSheet()
    window.model_panel.target.set_value(good)
    assert not panel.target.combo.styleSheet()  # the fix takes the outline off at once
    _run(qtbot, window, window.run_button)
    assert len(errors) == 1
    assert window.session_model.records[0].summary.new_tokens > 0
    assert panel.loaded.text().startswith("Loaded:") and not panel.target.combo.styleSheet()


def test_draft_with_another_tokenizer_loads_and_runs(qtbot, window, errors, tmp_path):
    """A draft with another tokenizer is loaded, not refused: the model panel and the drafter picker
    name the case and the shared-token count, and a session runs with drafts across the two."""
    from tiny import build_model, build_tokenizer

    other = tmp_path / "other"
    tokenizer = build_tokenizer(other, vocab_size=400)  # more tokens than the target knows
    build_model(other, "gpt2", len(tokenizer), seed=3, layers=1)
    window.model_panel.draft.set_value(str(other))
    _run(qtbot, window, window.model_panel.load_button)
    assert errors == [] and not window.model_panel.draft.combo.styleSheet()
    assert "different tokenizers" in window.model_panel.loaded.text()
    assert "of the draft's 399 tokens have a twin" in window.model_panel.drafter.toolTip()
    _run(qtbot, window, window.run_button)
    assert errors == []
    record = window.session_model.records[0]
    assert record.summary.new_tokens > 0 and record.summary.drafted > 0
    drafted = [e for e in record.tokens if e.depth and not e.copied]
    assert drafted and all(e.draft_tokens for e in drafted)  # each says what the draft wrote, in its tokens


def test_feature_head_session_runs_in_the_window(qtbot, window, errors, tiny_pair, tmp_path):
    """Choosing the feature-head drafter and a head folder: the session drafts from the head and
    the view holds exactly the kept text."""
    import torch
    from tiny import ON_CPU

    from specdeck.engine.drafting.heads import FeatureHead, fingerprint, head_config, save_head
    from specdeck.engine.loading.models import load_model

    model = load_model(str(tiny_pair[0]), ON_CPU).model
    torch.manual_seed(0)
    output_layer = model.get_output_embeddings().weight
    save_head(
        FeatureHead(head_config(model.config)),
        tmp_path / "head",
        output_layer.shape[0],
        "tiny",
        fingerprint(output_layer),
    )
    window.model_panel.drafter.setCurrentText("feature head")
    window.model_panel.draft.set_value(str(tmp_path / "head"))
    _run(qtbot, window, window.run_button)
    assert errors == []
    summary = window.session_model.records[0].summary
    assert summary.new_tokens > 0 and summary.drafted > 0
    window.speculative_view.show_rejected.setChecked(False)
    assert window.speculative_view.kept_text() == summary.text
    assert "feature head" in window.model_panel.loaded.text()


def test_another_target_with_the_opening_pair_loads_prompt_lookup_and_says_why(qtbot, window, errors):
    """The tiny target with the drafter left at the built-in pair the panel opens with loads prompt
    lookup, and the panel says why in a line of its own."""
    from specdeck.engine.loading.registry import DEFAULT_HEAD

    window.model_panel.drafter.setCurrentText("feature head")
    window.model_panel.draft.set_value(DEFAULT_HEAD)
    _run(qtbot, window, window.model_panel.load_button)
    assert errors == []
    assert window.session_model.pair.drafter == "prompt-lookup"
    shown = window.model_panel.loaded.text()
    assert "<br>" in shown and "gets prompt lookup" in shown and "feature head and draft are for" in shown


def test_suffix_session_drafts_from_the_earlier_answer(qtbot, window, errors):
    """With the suffix drafter the same prompt run twice writes the same text and accepts more
    drafts the second time: the loaded pair keeps the first answer."""
    window.model_panel.drafter.setCurrentText("suffix")
    _run(qtbot, window, window.run_button)
    first = window.session_model.records[0].summary
    _run(qtbot, window, window.run_button)
    assert errors == []
    second = window.session_model.records[0].summary
    assert second.text == first.text
    assert second.accepted > first.accepted
    assert "suffix" in window.model_panel.loaded.text()


def test_switching_the_drafter_keeps_the_loaded_target(qtbot, window, errors, monkeypatch):
    """Another drafter for the same target loads the drafter alone: the target already in memory
    is the one the new pair decodes with, and the status says it was kept."""
    from specdeck.engine import session

    _run(qtbot, window, window.model_panel.load_button)
    loads: list[str] = []
    monkeypatch.setattr(session, "load_model", lambda name, *args, **kwargs: loads.append(name))
    stages: list[str] = []
    window.host.load_progress.connect(stages.append)
    window.model_panel.drafter.setCurrentText("prompt lookup")
    _run(qtbot, window, window.run_button)
    assert errors == [] and loads == [], loads
    assert any("Keeping" in stage for stage in stages), stages
    assert window.session_model.records[0].summary.drafted > 0
    assert "prompt lookup" in window.model_panel.loaded.text()


def test_layer_skip_session_shows_its_layers(qtbot, window, errors, tmp_path, monkeypatch):
    """With the layer-skip drafter the model panel names the target's layers that draft and their
    measured agreement, the drafter's tooltip each count measured, and greedy text is plain text;
    a count set in the panel is the one loaded."""
    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path))
    window.model_panel.drafter.setCurrentText("layer skip")
    assert not window.model_panel.draft.isEnabled() and window.model_panel.draft_layers.isEnabled()
    _run(qtbot, window, window.compare_button)
    assert errors == []
    assert "layer skip (first 1 of 2 layers, agreement" in window.model_panel.loaded.text()
    assert "the count measured to pay best. Measured: L=1: a " in window.model_panel.drafter.toolTip()
    window.model_panel.draft_layers.setValue(1)
    assert window.model_panel.spec().draft_layers == 1
    _run(qtbot, window, window.model_panel.load_button)
    assert "as set. Measured: L=1: a " in window.model_panel.drafter.toolTip()
    speculative, plain = window.session_model.records
    assert speculative.summary.drafted > 0 and speculative.summary.text == plain.summary.text


def test_closing_during_a_run_leaves_no_thread_running(qtbot, window):
    """Closing the window mid-session stops the session and ends the model thread."""
    window.decoding_panel.max_new_tokens.setValue(4000)
    window.run_button.click()
    qtbot.waitUntil(lambda: len(window.speculative_view.tokens) > 5, timeout=TIMEOUT_MS)
    window.close()
    assert not window.host.thread_running


def test_settings_persist_between_launches(qtbot, loop, window, settings):
    """Parameters and models chosen in one launch are there in the next."""
    from specdeck.app.main_window import MainWindow

    window.decoding_panel.k.setValue(7)
    window.decoding_panel.temperature.setValue(0.7)
    window.decoding_panel.lookup.setValue(3)
    window.decoding_panel.suffix_scope.setCurrentText("all")
    window.close()
    again = MainWindow(settings=settings)
    qtbot.addWidget(again)
    assert again.decoding_panel.k.value() == 7
    assert again.decoding_panel.temperature.value() == 0.7
    assert again.decoding_panel.config().lookup == 3
    assert again.decoding_panel.config().suffix_scope == "all"
    assert again.model_panel.target.value == window.model_panel.target.value
    assert again.model_panel.drafter.currentText() == "draft model"
    again.close()


def test_token_events_arrive_in_order_and_complete(qtbot, window):
    """Batches lose nothing: token positions of kept tokens run 0..n-1 without gaps."""
    window.decoding_panel.max_new_tokens.setValue(120)
    _run(qtbot, window, window.run_button)
    kept = [e.pos for e in window.session_model.records[0].tokens if isinstance(e, TokenEvent) and e.state.kept]
    assert kept == list(range(window.session_model.records[0].summary.new_tokens))


def test_about_lists_the_versions(qtbot, window):
    """The About text names SpecDeck, torch, transformers, Qt and the device."""
    from specdeck.app.dialogs import about_text

    text = about_text("cpu")
    for name in ("SpecDeck", "torch", "transformers", "Qt", "device", "cpu"):
        assert name in text


def test_fresh_window_offers_the_default_pair(qtbot, loop, settings):
    """A first launch proposes the built-in target with its feature head; choosing the draft-model
    drafter swaps in the built-in draft, and back; either built-in head gives way to the draft."""
    from specdeck.app.main_window import MainWindow
    from specdeck.engine.loading.registry import DEFAULT_DRAFT, DEFAULT_HEAD, DEFAULT_TARGET, LAST_STATE_HEAD

    fresh = MainWindow(settings=settings)
    qtbot.addWidget(fresh)
    panel = fresh.model_panel
    assert (panel.target.value, panel.drafter.currentText(), panel.draft.value) == (
        DEFAULT_TARGET,
        "feature head",
        DEFAULT_HEAD,
    )
    panel.drafter.setCurrentText("draft model")
    assert panel.draft.value == DEFAULT_DRAFT
    panel.drafter.setCurrentText("feature head")
    assert panel.draft.value == DEFAULT_HEAD
    panel.draft.set_value(LAST_STATE_HEAD)  # the head on the last state alone is built in too
    panel.drafter.setCurrentText("draft model")
    assert panel.draft.value == DEFAULT_DRAFT
    fresh.close()


def test_demo_refuses_an_unknown_preset_before_loading(qtbot, loop, settings, capsys):
    """`specdeck gui --demo --preset NAME` names the presets there are when NAME is not one of them,
    exits with status 2 without loading a model, and closes its window."""
    from specdeck.app.main import demo
    from specdeck.app.main_window import MainWindow

    demo_window = MainWindow(settings=settings)
    qtbot.addWidget(demo_window)
    demo_window.show()
    task = asyncio.ensure_future(demo(demo_window, None, None, "poetry"))
    qtbot.waitUntil(task.done, timeout=5000)
    assert task.result() == 2
    err = capsys.readouterr().err
    assert "no preset 'poetry'" in err and "summarization" in err
    assert demo_window.host.pair is None and not demo_window.isVisible()


def test_long_prompt_is_refused_or_cut_and_the_answer_stops_at_the_context(qtbot, window, errors):
    """Past the context a prompt is refused in a dialog; allowed, its end runs and the status bar says so."""
    window.decoding_panel.chat.setChecked(False)
    window.decoding_panel.prompt.setPlainText("The quick brown fox jumps over the lazy dog. " * 100)
    _run(qtbot, window, window.run_button)
    assert len(errors) == 1 and "context 512" in errors[0][1]
    window.decoding_panel.truncate_prompt.setChecked(True)
    window.decoding_panel.max_new_tokens.setValue(4)
    _run(qtbot, window, window.run_button)
    assert len(errors) == 1 and window.session_model.records[0].summary.new_tokens == 4
    assert "kept its last 508 tokens" in window.statusBar().currentMessage()


def test_running_out_of_memory_says_what_to_try_and_the_next_run_works(qtbot, window, errors, monkeypatch):
    """A session that runs out of memory shows what to try (not "Unexpected error"), and the next
    run on the same loaded pair completes."""
    import torch

    from specdeck.engine import session as engine_session

    real_generate, calls = engine_session.generate, []

    def out_of_memory_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(engine_session, "generate", out_of_memory_once)
    _run(qtbot, window, window.run_button)
    assert len(errors) == 1 and errors[0][1].startswith("Out of memory on the GPU.")
    assert "smaller dtype" in errors[0][1] and "Unexpected" not in errors[0][1]
    _run(qtbot, window, window.run_button)
    assert len(errors) == 1 and window.session_model.records[-1].summary is not None


def test_a_run_shows_something_moving_until_its_first_token(qtbot, window, monkeypatch):
    """From Run until the first token (loading, prefill, measuring costs) the status bar has a busy
    indicator; once tokens arrive the text moves instead, and at the end nothing is left moving."""
    import threading

    from specdeck.engine import session

    release = threading.Event()
    real_generate = session.generate

    def slow_start(*args, **kwargs):
        release.wait(30)  # the session's start: nothing of it reaches the window yet
        yield from real_generate(*args, **kwargs)

    monkeypatch.setattr(session, "generate", slow_start)
    window.run_button.click()
    qtbot.waitUntil(
        lambda: window.session_model.activity.running and bool(window.session_model.records), timeout=TIMEOUT_MS
    )
    assert window.waiting.isVisible() and not window.speculative_view.tokens
    release.set()
    qtbot.waitUntil(lambda: window.idle, timeout=TIMEOUT_MS)
    assert not window.waiting.isVisible() and window.speculative_view.tokens


def test_after_the_text_a_sessions_measuring_shows_something_moving(qtbot, window, monkeypatch):
    """A session whose text is whole but which still measures the machine's costs (after its
    summary) keeps the busy indicator and says what it is doing; at its end nothing moves."""
    import threading

    from specdeck.app.main_window import MEASURING
    from specdeck.engine import session
    from specdeck.engine.events import SummaryEvent

    release = threading.Event()
    real_generate = session.generate

    def measuring_after(*args, **kwargs):
        for event in real_generate(*args, **kwargs):
            yield event
            if isinstance(event, SummaryEvent):
                release.wait(30)  # the measurement after the text

    monkeypatch.setattr(session, "generate", measuring_after)
    window.run_button.click()
    qtbot.waitUntil(lambda: window.session_model.summary("speculative") is not None, timeout=TIMEOUT_MS)
    qtbot.waitUntil(lambda: window.waiting.isVisible(), timeout=TIMEOUT_MS)
    assert window.statusBar().currentMessage() == MEASURING and not window.idle
    release.set()
    qtbot.waitUntil(lambda: window.idle, timeout=TIMEOUT_MS)
    assert not window.waiting.isVisible() and window.statusBar().currentMessage() != MEASURING
