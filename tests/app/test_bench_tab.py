"""The Benchmark tab with a tiny model pair: the summary table, progress, cancel, export, bad input."""

from __future__ import annotations

import csv

import pytest
from tiny import write_two_prompts

from specdeck.bench.tables import SUMMARY_COLUMNS
from specdeck.engine.config import DecodeConfig

TIMEOUT_MS = 60_000


@pytest.fixture
def two_prompts(tmp_path):
    return write_two_prompts(tmp_path / "prompts.jsonl")


@pytest.fixture
def bench(window, two_prompts, monkeypatch):
    """The window's Benchmark tab, on the two-prompt file chosen with Browse..., short runs."""
    tab = window.bench_tab
    window.tabs.setCurrentWidget(tab)
    monkeypatch.setattr("specdeck.app.bench_tab.QFileDialog.getOpenFileName", lambda *a, **k: (str(two_prompts), ""))
    tab.browse_button.click()
    tab.ks.setText("2")
    tab.max_new_tokens.setValue(10)
    tab.repeats.setValue(1)
    return tab


def _table(tab) -> list[dict]:
    header = [tab.table.horizontalHeaderItem(c).toolTip().split()[0] for c in range(tab.table.columnCount())]
    return [{name: tab.table.item(r, c).text() for c, name in enumerate(header)} for r in range(tab.table.rowCount())]


def _run(qtbot, window) -> None:
    window.bench_tab.run_button.click()
    qtbot.waitUntil(lambda: window.idle, timeout=TIMEOUT_MS)


def test_table_has_a_row_per_method_and_category_and_greedy_runs_are_identical(qtbot, window, bench, errors):
    """One row per method and category plus `all`; greedy methods match plain; the bar ends full."""
    _run(qtbot, window)
    assert errors == []
    rows = _table(bench)
    assert tuple(rows[0]) == SUMMARY_COLUMNS
    methods = ["plain", "speculative", "hf", "hf-assisted"]
    assert [(r["method"], r["category"]) for r in rows] == [
        (m, c) for m in methods for c in ("summarization", "qa", "all")
    ]
    assert all(r["identical_to_plain"] == "true" for r in rows)
    assert all(int(r["prompts"]) == (2 if r["category"] == "all" else 1) for r in rows)
    assert bench.progress.maximum() == 2 * len(methods) and bench.progress.value() == bench.progress.maximum()
    assert [image.name for image in bench.plot_images] == ["speedup_by_category.png"]
    assert not bench.plot_images[0].pixmap.isNull()
    assert bench.export_button.isEnabled()


def test_export_writes_the_files_of_a_k_sweep(qtbot, window, bench, errors, tmp_path, monkeypatch):
    """A sweep K=1,2 with lookup 0,2 exports summary.csv matching the table, k_sweep.csv with a row per K and
    lookup, report and plots."""
    bench.ks.setText("1,2")
    bench.lookups.setText("0,2")
    bench.baselines["hf"].setChecked(False)
    bench.baselines["hf-assisted"].setChecked(False)
    _run(qtbot, window)
    assert errors == []
    out = tmp_path / "exported"
    out.mkdir()
    monkeypatch.setattr("specdeck.app.bench_tab.QFileDialog.getExistingDirectory", lambda *a, **k: str(out))
    bench.export_button.click()
    assert errors == [] and str(out) in bench.stage.text()
    assert {p.name for p in out.iterdir() if not p.name.startswith(".")} == {  # but its list of what it wrote
        "summary.csv",
        "per_prompt.csv",
        "k_sweep.csv",
        "report.md",
        "speedup_by_category.png",
        "k_sweep.png",
    }
    with open(out / "summary.csv", newline="", encoding="utf-8") as handle:
        assert list(csv.DictReader(handle)) == _table(bench)
    with open(out / "k_sweep.csv", newline="", encoding="utf-8") as handle:
        assert [row["k"] for row in csv.DictReader(handle)] == ["1", "1", "2", "2"]
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "specdeck bench" in report and "--k 1,2 --lookup 0,2" in report and str(bench.prompt_file) in report


def test_other_drafters_are_timed_beside_the_loaded_one(qtbot, window, bench, errors, tmp_path, monkeypatch):
    """'Also compare' times more drafters of the loaded target against the same plain runs: each has
    its rows (the drafter column tells them apart), greedy outputs stay identical, and the report's
    command names every drafter."""
    bench.drafters.setText("prompt-lookup")
    bench.baselines["hf"].setChecked(False)
    bench.baselines["hf-assisted"].setChecked(False)
    _run(qtbot, window)
    assert errors == []
    rows = _table(bench)
    speculative = [r for r in rows if r["method"] == "speculative"]
    assert [r["drafter"] for r in speculative if r["category"] == "all"] == [
        f"draft {window.host.pair.draft} + prompt lookup {DecodeConfig.lookup}",
        "prompt lookup",
    ]
    assert len(speculative) == 2 * 3 and all(r["identical_to_plain"] == "true" for r in rows)
    assert bench.progress.maximum() == 2 * 3
    out = tmp_path / "exported"
    out.mkdir()
    monkeypatch.setattr("specdeck.app.bench_tab.QFileDialog.getExistingDirectory", lambda *a, **k: str(out))
    bench.export_button.click()
    report = (out / "report.md").read_text(encoding="utf-8")
    assert f"--drafters draft-model:{window.model_panel.spec().draft},prompt-lookup" in report


def test_cancel_stops_the_benchmark_and_a_session_runs_after(qtbot, window, bench, errors):
    """Cancel ends the benchmark without a table or a dialog; the next session runs normally."""
    bench.repeats.setValue(100)  # thousands of runs: only a real cancel lets the session below start in time
    bench.run_button.click()
    qtbot.waitUntil(lambda: bench.progress.value() > 2, timeout=TIMEOUT_MS)
    assert bench.cancel_button.isEnabled()
    bench.cancel_button.click()
    qtbot.waitUntil(lambda: window.idle, timeout=TIMEOUT_MS)
    assert errors == []
    assert bench.table.rowCount() == 0 and not bench.export_button.isEnabled()
    assert bench.progress.value() < bench.progress.maximum()
    assert "cancelled" in bench.stage.text()
    window.run_button.click()
    qtbot.waitUntil(lambda: window.idle, timeout=TIMEOUT_MS)
    assert errors == []
    assert window.session_model.records[0].summary.new_tokens > 0


def test_bad_options_give_a_dialog_and_run_nothing(qtbot, window, bench, errors):
    """A K that is not a number, a category the file lacks, or an unknown drafter is refused with the reason."""
    bench.ks.setText("two")
    _run(qtbot, window)
    assert len(errors) == 1 and "K takes whole numbers" in errors[0][1]
    bench.ks.setText("2")
    bench.categories.setText("coding")
    _run(qtbot, window)
    assert len(errors) == 2 and "No prompts of category coding" in errors[1][1]
    bench.categories.setText("")
    bench.drafters.setText("medusa")
    _run(qtbot, window)
    assert len(errors) == 3 and "Unknown drafter 'medusa' in Also compare" in errors[2][1]
    assert bench.table.rowCount() == 0 and window.host.pair is None


def test_closing_during_a_benchmark_leaves_no_thread_running(qtbot, window, bench):
    """Closing the window mid-benchmark stops the harness and ends the model thread."""
    bench.repeats.setValue(100)
    bench.run_button.click()
    qtbot.waitUntil(lambda: bench.progress.value() > 2, timeout=TIMEOUT_MS)
    window.close()
    assert not window.host.thread_running


def test_plan_counts_the_runs_and_says_which_baselines_are_skipped(qtbot, window, bench, tmp_path):
    """Before starting, the tab states how many timed runs the settings make, an estimate from a
    measured rate, and that hf-assisted is skipped (and why) where it cannot run."""
    from specdeck.engine.pair import PairSpec

    spec = window.model_panel.spec()  # the draft-model drafter, K=2: Hugging Face runs it
    plan = bench.plan(spec, tokens_per_s=10.0)
    methods = 4  # plain, speculative K=2, hf, hf-assisted K=2
    assert f"{2 * 1 * methods} timed runs: 2 prompts x 1 repeats x {methods} methods" in plan
    assert "skipped" not in plan and "under a minute" in plan
    two_turns = tmp_path / "two_turns.jsonl"
    two_turns.write_text('{"question_id": 1, "category": "writing", "turns": ["Write a haiku.", "Now a limerick."]}\n')
    bench.prompts_path = two_turns  # a second turn is a run of its own, as the harness runs it
    assert f"{2 * methods} timed runs: 1 prompts (2 turns) x 1 repeats" in bench.plan(spec)
    bench.prompts_path = None
    bench.ks.setText("auto")
    assert "hf-assisted is skipped</b>: it needs a fixed K" in bench.plan(spec)
    bench.ks.setText("2")
    assert "Hugging Face has no feature head drafter" in bench.plan(PairSpec())
    window.tabs.setCurrentWidget(bench)
    assert "timed runs" in bench.plan_note.text() and not window.decoding_panel.isEnabled()
    window.tabs.setCurrentIndex(0)
    assert window.decoding_panel.isEnabled()


def test_table_headers_are_words_and_name_their_column(qtbot):
    """Headers read as words (two lines when long); each names its summary.csv column in its tooltip."""
    from specdeck.app.bench_tab import BenchmarkTab

    tab = BenchmarkTab()
    qtbot.addWidget(tab)
    headers = [tab.table.horizontalHeaderItem(c) for c in range(tab.table.columnCount())]
    assert all("_" not in h.text() for h in headers)
    assert [h.toolTip().split()[0] for h in headers] == list(SUMMARY_COLUMNS)


def test_before_a_run_the_progress_counts_nothing_and_the_prompt_file_shows_whole(qtbot):
    """A fresh tab's progress bar claims no count of runs (the plan says how many there will be);
    once the harness reports, it counts its runs; the prompt file's name is not cut."""
    from specdeck.app.bench_tab import SAMPLE_LABEL, BenchmarkTab

    tab = BenchmarkTab()
    qtbot.addWidget(tab)
    tab.resize(900, 700)
    tab.show()
    qtbot.waitExposed(tab)
    assert "/" not in tab.progress.text() and not tab.plots.isVisible()
    assert tab.source.width() > tab.source.fontMetrics().horizontalAdvance(SAMPLE_LABEL)
    tab.start()
    tab.show_progress(3, 567, "prompt 4")
    assert tab.progress.text() == "3/567 runs"
