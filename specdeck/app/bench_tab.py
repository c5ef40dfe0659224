"""The Benchmark tab: the `specdeck bench` harness on the loaded pair, from the window.

The tab holds the options (prompt file, categories, K or a K sweep, other drafters of the loaded
target to time beside its own, baselines, lengths), a progress
bar, the summary table (summary.csv's columns) and the plots the harness draws. It never runs the
harness itself: the window sends it to the model thread and hands the tab progress and the
outcome. Export writes the files the harness wrote (CSVs, report.md, plots) into a chosen folder.
The table and the plots are drawn by `specdeck.app.bench_results`; what Run benchmark will do is said by
`specdeck.app.bench_plan`.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from specdeck.app import dialogs
from specdeck.app.bench_plan import bench_command_line, describe_plan
from specdeck.app.bench_results import PlotImage, SummaryTable
from specdeck.app.panels import double_spin_box, spin_box
from specdeck.app.session_model import Activity, SessionModel
from specdeck.app.worker import BenchOutcome
from specdeck.bench.prompts import BenchPrompt, read_prompts, sample_prompts
from specdeck.bench.settings import BASELINES, BenchSettings
from specdeck.bench.sweep import format_ks, format_lookups, parse_drafters, parse_ks, parse_lookups
from specdeck.engine.atomic import filling_folder
from specdeck.engine.config import DecodeConfig
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.pair_spec import DrafterKind, PairSpec

SAMPLE_LABEL = "bundled Spec-Bench sample"
SPEEDUP_PLOT = "speedup_by_category.png"  # shown first: the figure the benchmark is for


class BenchmarkTab(QWidget):
    """The benchmark's options, progress and results; given a `SessionModel`, its buttons follow
    what runs (Run only when nothing does, Cancel while a benchmark runs)."""

    options_changed = Signal()  # an option that changes what Run benchmark does

    def __init__(self, model: SessionModel | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.prompts_path: Path | None = None  # None: the bundled sample
        self.outcome: BenchOutcome | None = None
        self.source = QLineEdit(SAMPLE_LABEL)
        self.source.setReadOnly(True)
        self.browse_button = QPushButton("Browse…")
        self.browse_button.setToolTip("Spec-Bench jsonl, HumanEval jsonl, or one prompt per line")
        self.sample_button = QPushButton("Sample")
        self.sample_button.setToolTip("The bundled Spec-Bench sample: a few prompts per category")
        self.browse_button.clicked.connect(self._on_browse_clicked)
        self.sample_button.clicked.connect(self._on_sample_clicked)
        self.categories = QLineEdit()
        self.categories.setToolTip("Comma-separated categories to keep; empty keeps all")
        self.limit = spin_box(0, 100000, 0)
        self.limit.setSpecialValueText("all")
        defaults = BenchSettings()
        self.ks = QLineEdit(format_ks(defaults.ks))
        self.ks.setToolTip(
            "Draft tokens per round, auto (chosen each round from measured costs), or a sweep: auto,1,2,4"
        )
        self.lookups = QLineEdit(format_lookups(defaults.lookups))
        self.lookups.setToolTip(
            "Tokens prompt lookup may copy per round where the text repeats, before asking the "
            "drafter; 0 is off; a sweep such as 0,2 times each"
        )
        self.drafters = QLineEdit()
        self.drafters.setPlaceholderText("e.g. draft-model,prompt-lookup")
        self.drafters.setToolTip(
            "Other drafters of the loaded target, timed in the same run against the same plain "
            f"runs: comma-separated kinds ({', '.join(kind.value for kind in DrafterKind)}), each "
            "optionally kind:MODEL. Empty: the loaded drafter only"
        )
        self.baselines = {name: QCheckBox(name) for name in BASELINES}
        for name, box in self.baselines.items():
            box.setChecked(name in defaults.baselines)
        self.baselines["plain"].setEnabled(False)  # the harness always runs it: speedups refer to it
        self.baselines["plain"].setToolTip("SpecDeck's plain decoding always runs: speedups refer to it")
        self.temperature = double_spin_box(0.0, 5.0, defaults.decode.temperature, 0.1)
        self.temperature.setSpecialValueText("0 (greedy)")
        self.max_new_tokens = spin_box(1, 8192, defaults.decode.max_new_tokens)
        self.repeats = spin_box(1, 100, defaults.repeats)
        self.repeats.setToolTip("Timed runs per prompt and method; the median-time run is kept")
        self.run_button = QPushButton("Run benchmark")
        self.cancel_button = QPushButton("Cancel")
        self.export_button = QPushButton("Export…")
        self.export_button.setToolTip("Write summary.csv, per_prompt.csv, k_sweep.csv, report.md and the plots")
        self.export_button.clicked.connect(self._on_export_clicked)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)  # until a benchmark counts its runs: no count of its own to show
        self.progress.setValue(0)
        self.progress.setFormat("no benchmark run yet")
        self.stage = QLabel("Load a model pair, choose prompts, then Run benchmark.")
        self.stage.setWordWrap(True)
        self.plan_note = QLabel()  # what Run benchmark will do: runs, an estimate, skipped baselines
        self.plan_note.setWordWrap(True)
        self.plan_note.setTextFormat(Qt.TextFormat.RichText)
        scope = QLabel(
            "Runs the model panel's pair with the settings on this tab; the Decoding panel's "
            "settings apply to Run and Compare only."
        )
        scope.setWordWrap(True)
        scope.setStyleSheet("color: #555;")
        self.scope_note = scope
        self.table = SummaryTable()
        self.plots = QTabWidget()  # one page per plot, each as wide as the tab
        self.plot_images: list[PlotImage] = []
        self._build_layout()
        self._on_source_changed()
        self.cancel_button.setEnabled(False)
        self.export_button.setEnabled(False)
        for edit in (self.categories, self.ks, self.lookups, self.drafters):
            edit.editingFinished.connect(self.options_changed)
        for spin in (self.limit, self.max_new_tokens, self.repeats):
            spin.valueChanged.connect(self.options_changed)
        self.temperature.valueChanged.connect(self.options_changed)
        for box in self.baselines.values():
            box.toggled.connect(self.options_changed)
        if model is not None:
            model.activity_changed.connect(self._on_activity_changed)

    def _on_activity_changed(self, activity: Activity) -> None:
        self.run_button.setEnabled(not activity.busy)
        self.cancel_button.setEnabled(activity.benchmarking)

    def _build_layout(self) -> None:
        options = QGroupBox("Benchmark")
        form = QFormLayout(options)
        # the file's name on a row of its own, whole; its buttons below it
        source_buttons = QHBoxLayout()
        source_buttons.addWidget(self.browse_button)
        source_buttons.addWidget(self.sample_button)
        source_buttons.addStretch(1)
        form.addRow("Prompts", self.source)
        form.addRow("", source_buttons)
        form.addRow("Categories", self.categories)
        form.addRow("Limit per category", self.limit)
        form.addRow("K", self.ks)
        form.addRow("Lookup", self.lookups)
        form.addRow("Also compare", self.drafters)
        baseline_row = QHBoxLayout()
        for box in self.baselines.values():
            baseline_row.addWidget(box)
        form.addRow("Baselines", baseline_row)
        form.addRow("Temperature", self.temperature)
        form.addRow("Max new tokens", self.max_new_tokens)
        form.addRow("Repeats", self.repeats)
        form.addRow(self.scope_note)
        scroll = QScrollArea()
        scroll.setWidget(options)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        # what Run benchmark will do, the buttons and the progress stay in view below the options,
        # which scroll where the window is short
        left = QWidget()
        column = QVBoxLayout(left)
        column.setContentsMargins(0, 0, 0, 0)
        buttons = QHBoxLayout()
        for button in (self.run_button, self.cancel_button, self.export_button):
            buttons.addWidget(button)
        column.addWidget(scroll, 1)
        column.addWidget(self.plan_note)
        column.addLayout(buttons)
        column.addWidget(self.progress)
        column.addWidget(self.stage)

        top = QSplitter(Qt.Orientation.Horizontal)
        top.addWidget(left)
        top.addWidget(self.table)
        top.setChildrenCollapsible(False)
        top.setStretchFactor(1, 1)
        top.setSizes([420, 700])
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.addWidget(top)
        self.splitter.addWidget(self.plots)
        self.plots.setVisible(False)  # until a benchmark drew plots
        self.splitter.setSizes([420, 380])
        QVBoxLayout(self).addWidget(self.splitter)

    # what to run ------------------------------------------------------------------------------------

    @property
    def prompt_file(self) -> Path:
        return self.prompts_path or sample_prompts()

    def prompts(self) -> list[BenchPrompt]:
        """The chosen prompts; raises SpecDeckError if the file, categories or limit are wrong."""
        categories = [c.strip() for c in self.categories.text().split(",") if c.strip()] or None
        return read_prompts(self.prompt_file, categories, self.limit.value() or None)

    def other_drafters(self, models: PairSpec) -> list[PairSpec]:
        """The drafters to time beside the loaded pair `models`; raises SpecDeckError for an unknown kind."""
        if not self.drafters.text().strip():
            return []
        return [
            models.with_drafter(kind, draft) for kind, draft in parse_drafters(self.drafters.text(), "Also compare")
        ]

    def settings(self) -> BenchSettings:
        return BenchSettings(
            ks=parse_ks(self.ks.text()),
            lookups=parse_lookups(self.lookups.text()),
            baselines=tuple(name for name, box in self.baselines.items() if box.isChecked()),
            repeats=self.repeats.value(),
            decode=DecodeConfig(temperature=self.temperature.value(), max_new_tokens=self.max_new_tokens.value()),
        )

    def plan(self, models: PairSpec, tokens_per_s: float | None = None) -> str:
        """What Run benchmark will do with the pair `models`: the timed runs, an estimate of their time
        from a measured rate (if one is known), and each ticked baseline that will not run, with why;
        raises SpecDeckError for settings or prompts that cannot run."""
        settings, prompts = self.settings(), self.prompts()
        specs = [models.resolved(), *(spec.resolved() for spec in self.other_drafters(models))]
        return describe_plan(settings, prompts, specs, tokens_per_s)

    def show_plan(self, models: PairSpec, tokens_per_s: float | None = None) -> None:
        try:
            self.plan_note.setText(self.plan(models, tokens_per_s))
        except SpecDeckError as error:
            self.plan_note.setText(f"<span style='color:#c62828'>{error}</span>")

    def command_line(self, models: PairSpec) -> str:
        """The `specdeck bench` command that runs the same benchmark from a terminal."""
        others = self.other_drafters(models)
        categories = [c.strip() for c in self.categories.text().split(",") if c.strip()]
        return bench_command_line(models, others, self.prompts_path, categories, self.limit.value(), self.settings())

    # progress and results ---------------------------------------------------------------------------

    def start(self) -> None:
        self.outcome = None
        self.export_button.setEnabled(False)
        self.table.setRowCount(0)
        self._show_plots({})
        self.progress.setFormat("%v/%m runs")
        self.progress.setRange(0, 0)  # busy until the harness counts its runs
        self.stage.setText("Starting…")

    def show_progress(self, done: int, total: int, label: str) -> None:
        self.progress.setRange(0, total)
        self.progress.setValue(done)
        self.stage.setText("Writing the tables and plots…" if label == "done" else label)

    def show_outcome(self, outcome: BenchOutcome) -> None:
        self.outcome = outcome
        self.export_button.setEnabled(True)
        self.stage.setText(f"Done: {len(outcome.summary)} summary rows. Export… writes the CSVs, report and plots.")
        self.table.show_rows(outcome.summary)
        plots = sorted((name for name in outcome.files if name.endswith(".png")), key=lambda n: n != SPEEDUP_PLOT)
        self._show_plots({name: outcome.files[name] for name in plots})

    def show_stopped(self, message: str) -> None:
        self.progress.setRange(0, max(self.progress.maximum(), 1))
        self.stage.setText(message)

    def _show_plots(self, images: dict[str, bytes]) -> None:
        self.plots.clear()
        for image in self.plot_images:
            image.deleteLater()
        self.plot_images = [PlotImage(name, data) for name, data in images.items()]
        for image in self.plot_images:
            self.plots.addTab(image, image.name.removesuffix(".png").replace("_", " "))
        # no empty pane before there are plots: the options and the table take its room
        self.plots.setVisible(bool(self.plot_images))

    def export(self, folder: str | Path) -> list[Path]:
        """Write the last benchmark's files into `folder` (each atomically); raises SpecDeckError."""
        if self.outcome is None:
            raise SpecDeckError("Nothing to export yet: run a benchmark first.")
        folder = Path(folder)
        if not folder.is_dir():
            raise SpecDeckError(f"Cannot write into {folder}: it is not a folder.")
        with filling_folder(folder, replaces=self.outcome.files) as staging:  # refuses a folder of others' files
            for name, data in self.outcome.files.items():
                (staging / name).write_bytes(data)
        return [folder / name for name in self.outcome.files]

    # slots ------------------------------------------------------------------------------------------

    def _on_browse_clicked(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Choose benchmark prompts", str(dialogs.start_folder()), "Prompt files (*.jsonl *.txt);;All files (*)"
        )
        if path:
            self._set_prompts_path(Path(path))

    def _on_sample_clicked(self) -> None:
        self._set_prompts_path(None)

    def _set_prompts_path(self, path: Path | None) -> None:
        previous = self.prompts_path
        self.prompts_path = path
        if not self._on_source_changed():
            self.prompts_path = previous
            self._on_source_changed()
        self.options_changed.emit()

    def _on_source_changed(self) -> bool:
        """Show the chosen file and its categories; a file that cannot be read gets a dialog."""
        self.source.setText(str(self.prompts_path) if self.prompts_path else SAMPLE_LABEL)
        try:
            found = read_prompts(self.prompt_file)
        except SpecDeckError as error:
            dialogs.show_error(self, "Cannot use these prompts", str(error))
            return False
        categories = list(dict.fromkeys(p.category for p in found))
        self.categories.setPlaceholderText("all: " + ", ".join(categories))
        self.source.setToolTip(f"{len(found)} prompts in {len(categories)} categories")
        return True

    def _on_export_clicked(self) -> None:
        folder = QFileDialog.getExistingDirectory(
            self, "Export the benchmark into a folder", str(dialogs.start_folder())
        )
        if not folder:
            return
        try:
            written = self.export(folder)
        except SpecDeckError as error:
            dialogs.show_error(self, "Export failed", f"{error}\nThe benchmark's results are kept: try another folder.")
            return
        self.stage.setText(f"Wrote {len(written)} files into {folder}: " + ", ".join(p.name for p in written))

    # settings ---------------------------------------------------------------------------------------

    def save(self, settings: QSettings) -> None:
        settings.setValue("bench/prompts", str(self.prompts_path) if self.prompts_path else "")
        settings.setValue("bench/categories", self.categories.text())
        settings.setValue("bench/ks", self.ks.text())
        settings.setValue("bench/lookups", self.lookups.text())
        settings.setValue("bench/drafters", self.drafters.text())
        settings.setValue("bench/baselines", ",".join(n for n, box in self.baselines.items() if box.isChecked()))
        for name in ("limit", "max_new_tokens", "repeats"):
            settings.setValue(f"bench/{name}", getattr(self, name).value())
        settings.setValue("bench/temperature", self.temperature.value())

    def restore(self, settings: QSettings) -> None:
        path = str(settings.value("bench/prompts", ""))
        self._set_prompts_path(Path(path) if path and Path(path).is_file() else None)
        self.categories.setText(str(settings.value("bench/categories", "")))
        self.ks.setText(str(settings.value("bench/ks", self.ks.text())))
        self.lookups.setText(str(settings.value("bench/lookups", self.lookups.text())))
        self.drafters.setText(str(settings.value("bench/drafters", self.drafters.text())))
        chosen = str(settings.value("bench/baselines", ",".join(BenchSettings().baselines))).split(",")
        for name, box in self.baselines.items():
            box.setChecked(name in chosen or not box.isEnabled())
        for name in ("limit", "max_new_tokens", "repeats"):
            widget = getattr(self, name)
            widget.setValue(int(settings.value(f"bench/{name}", widget.value())))
        self.temperature.setValue(float(settings.value("bench/temperature", self.temperature.value())))
