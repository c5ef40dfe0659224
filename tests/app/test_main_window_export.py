"""Export: one CSV row per round whose totals match the summary; atomic writes; failures keep the data."""

from __future__ import annotations

import csv
import json

import pytest

from specdeck.engine.errors import SpecDeckError
from specdeck.engine.export import ROUND_COLUMNS


def _compare(qtbot, window) -> None:
    window.compare_button.click()
    qtbot.waitUntil(lambda: window.idle, timeout=60_000)


def test_csv_has_one_row_per_round_and_totals_match(qtbot, window, tmp_path, errors):
    """Each session's rows add up to its summary; the metadata names the models and parameters."""
    _compare(qtbot, window)
    window.menus.per_token_rows.setChecked(True)
    written = window.export_csv(tmp_path / "run.csv")
    assert [p.name for p in written] == ["run.csv", "run.meta.json", "run.tokens.csv"]
    with open(tmp_path / "run.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == ROUND_COLUMNS
    for record in window.session_model.records:
        mine = [r for r in rows if int(r["session"]) == record.session]
        assert {r["mode"] for r in mine} == {record.mode}
        assert len(mine) == record.summary.rounds
        assert sum(int(r["drafted"]) for r in mine) == record.summary.drafted
        assert sum(int(r["accepted"]) for r in mine) == record.summary.accepted
        assert int(mine[-1]["tokens_so_far"]) == record.summary.new_tokens
    meta = json.loads((tmp_path / "run.meta.json").read_text(encoding="utf-8"))
    assert meta["models"]["drafter"] == "draft-model"
    assert meta["parameters"]["max_new_tokens"] == 40 and meta["seed"] == 0
    assert {"torch", "transformers", "Qt"} <= set(meta["versions"])
    assert [s["summary"]["new_tokens"] for s in meta["sessions"]] == [
        r.summary.new_tokens for r in window.session_model.records
    ]
    with open(tmp_path / "run.tokens.csv", newline="", encoding="utf-8") as handle:
        tokens = list(csv.DictReader(handle))
    assert len(tokens) == sum(len(r.tokens) for r in window.session_model.records)


def test_failed_export_says_so_and_keeps_the_data(qtbot, window, tmp_path, errors, monkeypatch):
    """Writing into a missing folder shows a dialog; the rows stay in memory and a retry succeeds."""
    _compare(qtbot, window)
    missing = tmp_path / "missing" / "run.csv"
    monkeypatch.setattr("specdeck.app.main_window.QFileDialog.getSaveFileName", lambda *a, **k: (str(missing), ""))
    window.export_button.click()
    assert len(errors) == 1 and "Cannot write" in errors[0][1] and "kept" in errors[0][1]
    assert not missing.parent.exists()
    assert len(window.session_model.records) == 2
    monkeypatch.setattr(
        "specdeck.app.main_window.QFileDialog.getSaveFileName", lambda *a, **k: (str(tmp_path / "ok.csv"), "")
    )
    window.export_button.click()
    assert len(errors) == 1 and (tmp_path / "ok.csv").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_charts_save_to_png(qtbot, window, tmp_path):
    """The charts can be saved as a PNG image."""
    window.save_charts(tmp_path / "charts.png")
    assert (tmp_path / "charts.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_charts_that_cannot_be_saved_leave_the_old_picture(qtbot, window, tmp_path):
    """A picture Qt cannot write is an error naming the path, and the earlier file stays as it was."""
    picture = tmp_path / "charts.nosuchformat"
    picture.write_bytes(b"earlier")
    with pytest.raises(SpecDeckError, match="charts.nosuchformat"):
        window.save_charts(picture)
    assert picture.read_bytes() == b"earlier" and [p.name for p in tmp_path.iterdir()] == [picture.name]


def test_the_export_dialog_opens_in_the_users_documents_not_where_specdeck_started(
    qtbot, window, tmp_path, monkeypatch, errors
):
    """File > Export opens in the documents folder (or home), not in the folder SpecDeck was
    started from, and the CSV lands where the dialog says."""
    from PySide6.QtWidgets import QFileDialog

    home = tmp_path / "home"
    (home / "Documents").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_DOCUMENTS_DIR", str(home / "Documents"))
    monkeypatch.chdir(tmp_path)
    _compare(qtbot, window)
    offered = []

    def save_as(parent, title, start, filters):
        offered.append(start)
        return str(home / "mine.csv"), filters

    monkeypatch.setattr(QFileDialog, "getSaveFileName", save_as)
    window.menus.export_action.trigger()
    assert offered and offered[0].startswith(str(home)) and (home / "mine.csv").is_file()
