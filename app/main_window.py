"""The main window: settings panels on the left; on the right, a Session tab (token views and
charts) and a Benchmark tab (the `specdeck bench` harness on the loaded pair).

Orchestration (load, run, compare) is written as coroutines on qasync's loop: each awaits the
model thread's futures (`ModelHost`), so the GUI thread never runs model code and never blocks.
The coroutines raise `SpecDeckError`; the button slots wrap them and turn errors into dialogs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings, Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QProgressDialog,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app import dialogs
from app.bench_tab import BenchmarkTab
from app.charts import SessionCharts
from app.panels import DecodingPanel, ModelPanel
from app.token_view import Legend, TokenView
from app.worker import BenchCancelled, LoadCancelled, ModelHost, PairInfo, error_message
from engine.atomic import write_with
from engine.context import prompt_cut_notice
from engine.errors import SpecDeckError
from engine.events import SessionStarted, SummaryEvent
from engine.export import RunInfo, SessionRecord, export_sessions
from engine.models import check_prompt
from engine.pair import PairSpec


def save_picture(widget: QWidget, path: str | Path) -> None:
    """Save what `widget` shows as an image (format from the suffix, PNG without one), whole or not
    at all (`engine.atomic`); raises SpecDeckError."""
    image = widget.grab()
    kind = Path(path).suffix.lstrip(".").upper() or "PNG"

    def save(temporary: Path) -> None:
        if not image.save(str(temporary), kind):
            raise OSError(f"Qt could not write a {kind} image")

    write_with(path, save)


class MainWindow(QMainWindow):
    def __init__(self, settings: QSettings | None = None, host: ModelHost | None = None) -> None:
        super().__init__()
        self.setWindowTitle("SpecDeck")
        self.settings = settings
        self.host = host or ModelHost()
        self.host.setParent(self)
        self.host.events.connect(self._on_session_events)
        self.host.load_progress.connect(self._on_load_progress)
        self.host.bench_progress.connect(self._on_bench_progress)

        self.model_panel = ModelPanel()
        self.model_panel.load_clicked.connect(self._on_load_clicked)
        self.decoding_panel = DecodingPanel()
        self.run_button = QPushButton("Run")
        self.stop_button = QPushButton("Stop")
        self.compare_button = QPushButton("Compare")
        self.compare_button.setToolTip("Speculative, then plain decoding on the same prompt and settings")
        self.export_button = QPushButton("Export CSV…")
        self.run_button.clicked.connect(self._on_run_clicked)
        self.stop_button.clicked.connect(self._on_stop_clicked)
        self.compare_button.clicked.connect(self._on_compare_clicked)
        self.export_button.clicked.connect(self._on_export_clicked)

        self.speculative_view = TokenView("Speculative")
        self.plain_view = TokenView("Plain")
        self.plain_view.show_rejected.hide()
        self.plain_view.hide()
        self.charts = SessionCharts()
        self.bench_tab = BenchmarkTab()
        self.bench_tab.run_button.clicked.connect(self._on_bench_clicked)
        self.bench_tab.cancel_button.clicked.connect(self._on_bench_cancel_clicked)
        self._build_layout()
        self._build_menus()

        self.records: list[SessionRecord] = []
        self.run_info: RunInfo | None = None
        self._routes: dict[int, tuple[TokenView, bool, SessionRecord]] = {}
        self._loaded_spec: PairSpec | None = None
        self._progress: QProgressDialog | None = None
        self._stop_requested = False
        self._busy = False
        self._prompt_notice = ""  # what truncation did to the last run's prompt, for the status bar
        self._benchmarking = False
        self._tasks: set[asyncio.Task] = set()
        self._update_buttons()
        self.resize(1440, 900)
        if settings is not None:
            self._restore_settings(settings)

    # layout -----------------------------------------------------------------------------------------

    def _build_layout(self) -> None:
        buttons = QHBoxLayout()
        for button in (self.run_button, self.stop_button, self.compare_button, self.export_button):
            buttons.addWidget(button)
        left = QWidget()
        column = QVBoxLayout(left)
        column.addWidget(self.model_panel)
        column.addWidget(self.decoding_panel, 1)
        column.addLayout(buttons)
        scroll = QScrollArea()
        scroll.setWidget(left)
        scroll.setWidgetResizable(True)
        scroll.setMinimumWidth(380)

        self.views = QSplitter(Qt.Orientation.Horizontal)
        self.views.addWidget(self.speculative_view)
        self.views.addWidget(self.plain_view)
        self.comparison = QLabel()
        self.comparison.setTextFormat(Qt.TextFormat.RichText)
        top = QWidget()
        top_layout = QVBoxLayout(top)
        top_layout.setContentsMargins(4, 4, 4, 4)
        legend_row = QHBoxLayout()
        legend_row.addWidget(Legend())
        legend_row.addWidget(self.comparison)
        top_layout.addLayout(legend_row)
        top_layout.addWidget(self.views, 1)

        self.right = QSplitter(Qt.Orientation.Vertical)
        self.right.addWidget(top)
        self.right.addWidget(self.charts)
        self.right.setSizes([430, 470])
        self.tabs = QTabWidget()
        self.tabs.addTab(self.right, "Session")
        self.tabs.addTab(self.bench_tab, "Benchmark")
        self.main_splitter = QSplitter(Qt.Orientation.Horizontal)
        self.main_splitter.addWidget(scroll)
        self.main_splitter.addWidget(self.tabs)
        self.main_splitter.setStretchFactor(1, 1)
        self.main_splitter.setSizes([400, 1040])
        self.setCentralWidget(self.main_splitter)
        self.statusBar().showMessage("Load a model pair, then Run or Compare.")

    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        export = QAction("&Export CSV…", self, shortcut=QKeySequence("Ctrl+E"))
        export.triggered.connect(self._on_export_clicked)
        self.per_token_rows = QAction("Include per-token rows", self, checkable=True)
        charts = QAction("Save charts as &PNG…", self)
        charts.triggered.connect(self._on_save_charts_clicked)
        quit_action = QAction("&Quit", self, shortcut=QKeySequence.StandardKey.Quit)
        quit_action.triggered.connect(self.close)
        file_menu.addActions([export, self.per_token_rows, charts])
        file_menu.addSeparator()
        file_menu.addAction(quit_action)
        help_menu = self.menuBar().addMenu("&Help")
        about = QAction("&About SpecDeck", self)
        about.triggered.connect(lambda: dialogs.show_about(self, self.host.pair.device if self.host.pair else None))
        help_menu.addAction(about)

    def _update_buttons(self) -> None:
        for button in (self.run_button, self.compare_button, self.model_panel.load_button, self.bench_tab.run_button):
            button.setEnabled(not self._busy)
        self.stop_button.setEnabled(self._busy and not self._benchmarking)
        self.export_button.setEnabled(not self._busy and bool(self.records))
        self.bench_tab.cancel_button.setEnabled(self._benchmarking)
        self.bench_tab.export_button.setEnabled(not self._benchmarking and self.bench_tab.outcome is not None)

    # orchestration ----------------------------------------------------------------------------------

    async def load_models(self) -> PairInfo:
        """Load the pair the model panel names, showing each stage in a cancellable progress dialog."""
        spec = self.model_panel.spec()
        self._progress = QProgressDialog("Loading…", "Cancel", 0, 0, self)
        self._progress.setWindowTitle("Loading models")
        self._progress.setWindowModality(Qt.WindowModality.WindowModal)
        self._progress.setMinimumDuration(0)
        self._progress.canceled.connect(self.host.cancel_load)
        self._progress.show()
        try:
            info = await self.host.load(spec)
        finally:
            self._progress.canceled.disconnect(self.host.cancel_load)
            self._progress.close()
            self._progress.deleteLater()
            self._progress = None
        self._loaded_spec = spec
        self.model_panel.remember(spec.target, spec.draft)
        self.model_panel.loaded.setText(f"Loaded: {info.description}")
        self.statusBar().showMessage(f"Loaded {info.description}")
        return info

    async def run(self, compare: bool = False) -> None:
        """One session (speculative with the pair's drafter), or a compare run: speculative, then plain,
        one after the other on the same device so neither timing disturbs the other."""
        self._busy = True
        self._stop_requested = False
        self._update_buttons()
        try:
            config = self.decoding_panel.config()
            prompt = check_prompt(self.decoding_panel.prompt_text())
            await self._ensure_loaded()
            pair = self.host.pair
            chat = self.decoding_panel.chat.isChecked()
            self.run_info = RunInfo(pair.target, pair.draft, pair.drafter, pair.device, pair.dtype, config, chat,
                                    prompt, extra_versions={k: v for k, v in dialogs.versions(pair.device).items()
                                                            if k in ("Qt", "PySide6", "pyqtgraph")})
            self.records = []
            self._prompt_notice = ""
            self._routes.clear()
            self.speculative_view.clear()
            self.plain_view.clear()
            self.plain_view.setVisible(compare)
            self.comparison.clear()
            self.charts.reset()
            speculative = await self._session(self.speculative_view, prompt, config, chat, plain=False)
            if compare and not self._stop_requested:
                self.charts.start_plain()
                plain = await self._session(self.plain_view, prompt, config, chat, plain=True)
                self._show_comparison(speculative, plain, config.greedy)
            self.statusBar().showMessage(" ".join(filter(None, (self._describe(speculative), self._prompt_notice))))
        finally:
            self._busy = False
            self._update_buttons()

    async def _ensure_loaded(self) -> None:
        """Load the pair the model panel names unless it is the resident one."""
        if self.host.pair is None or self._loaded_spec != self.model_panel.spec():
            await self.load_models()

    async def run_benchmark(self) -> None:
        """The benchmark tab's harness on the resident pair (loaded first if needed), in the model thread."""
        self._busy = True
        self._update_buttons()
        try:
            prompts = self.bench_tab.prompts()
            settings = self.bench_tab.settings()
            models = self.model_panel.spec()
            drafters = self.bench_tab.other_drafters(models)
            command = self.bench_tab.command_line(models)
            await self._ensure_loaded()
            self._benchmarking = True
            self._update_buttons()
            self.bench_tab.start()
            self.statusBar().showMessage(f"Benchmarking {len(prompts)} prompts…")
            try:
                outcome = await self.host.bench(prompts, settings, str(self.bench_tab.prompt_file), command,
                                                 tuple(drafters))
            except BenchCancelled as cancelled:
                self.bench_tab.show_stopped(str(cancelled))
                self.statusBar().showMessage(str(cancelled))
                return
            except SpecDeckError:
                self.bench_tab.show_stopped("The benchmark failed.")
                raise
            self.bench_tab.show_outcome(outcome)
            self.statusBar().showMessage("Benchmark done: " + ", ".join(
                f"{r['method']}{' K=' + str(r['k']) if r['k'] else ''} {r['speedup_vs_plain']}x"
                for r in outcome.summary if r["category"] == "all" and r["method"] != "plain"))
        finally:
            self._busy = self._benchmarking = False
            self._update_buttons()

    async def _session(self, view: TokenView, prompt, config, chat, plain: bool) -> SummaryEvent:
        session_id, finished = self.host.run(prompt, config, chat=chat, plain=plain)
        record = SessionRecord(session_id, "plain" if plain else "speculative")
        self.records.append(record)
        self._routes[session_id] = (view, plain, record)
        self.statusBar().showMessage("Plain decoding…" if plain else "Speculative decoding…")
        summary = await finished
        self.charts.redraw()
        return summary

    def _show_comparison(self, speculative: SummaryEvent, plain: SummaryEvent, greedy: bool) -> None:
        parts = []
        if self.charts.measured_speedup is not None:
            parts.append(f"measured speedup <b>{self.charts.measured_speedup:.2f}x</b>")
        if greedy:
            identical = speculative.text == plain.text
            self.charts.set_identical(identical)
            colour = "#1b8a2f" if identical else "#c62828"
            mark = "greedy outputs identical ✓" if identical else "greedy outputs differ ✗"
            parts.append(f"<b style='color:{colour}'>{mark}</b>")
        self.comparison.setText(" · ".join(parts))
        self.charts.redraw()

    @staticmethod
    def _describe(summary: SummaryEvent) -> str:
        return (f"{summary.new_tokens} tokens in {summary.rounds} rounds ({summary.stop_reason}), "
                f"{summary.tokens_per_s:.1f} tokens/s, acceptance {summary.acceptance_rate:.2f}")

    def export_csv(self, path: str | Path) -> list[Path]:
        """Write the last run's round CSV and metadata (and token rows if chosen); raises SpecDeckError."""
        if not self.records or self.run_info is None:
            raise SpecDeckError("Nothing to export yet: run a session first.")
        return export_sessions(path, self.run_info, self.records, per_token=self.per_token_rows.isChecked())

    def save_charts(self, path: str | Path) -> None:
        save_picture(self.charts, path)

    # slots ------------------------------------------------------------------------------------------

    def _spawn(self, coroutine, title: str) -> None:
        """Run an orchestration coroutine on the loop; its errors become a dialog."""

        async def guarded() -> None:
            try:
                await coroutine
            except LoadCancelled:
                self.statusBar().showMessage("Loading cancelled.")
            except asyncio.CancelledError:
                pass
            except Exception as error:  # noqa: BLE001 - a dialog, never a traceback
                self.statusBar().showMessage(title)
                dialogs.show_error(self, title, error_message(error))

        task = asyncio.ensure_future(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def idle(self) -> bool:
        return not self._tasks

    def _on_load_clicked(self) -> None:
        async def load() -> None:
            self._busy = True
            self._update_buttons()
            try:
                await self.load_models()
            finally:
                self._busy = False
                self._update_buttons()

        self._spawn(load(), "Could not load the models")

    def _on_run_clicked(self) -> None:
        self._spawn(self.run(compare=False), "The session failed")

    def _on_compare_clicked(self) -> None:
        self._spawn(self.run(compare=True), "The compare run failed")

    def _on_bench_clicked(self) -> None:
        self._spawn(self.run_benchmark(), "The benchmark failed")

    def _on_bench_cancel_clicked(self) -> None:
        self.host.cancel_bench()

    def _on_bench_progress(self, done: int, total: int, label: str) -> None:
        self.bench_tab.show_progress(done, total, label)

    def _on_stop_clicked(self) -> None:
        self._stop_requested = True
        self.host.stop()
        self.statusBar().showMessage("Stopping at the end of this round…")

    def _on_session_events(self, session_id: int, batch: tuple) -> None:
        route = self._routes.get(session_id)
        if route is None:
            return
        view, plain, record = route
        view.add_events(batch)
        for event in batch:
            if isinstance(event, SessionStarted) and event.prompt_tokens_dropped:
                self._prompt_notice = prompt_cut_notice(event.prompt_tokens, event.prompt_tokens_dropped)
        self.charts.add_events(batch, plain=plain)
        for event in batch:
            record.add(event)

    def _on_load_progress(self, stage: str) -> None:
        if self._progress is not None:
            self._progress.setLabelText(stage)
        self.statusBar().showMessage(stage)

    def _on_export_clicked(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export session statistics", "specdeck-session.csv", "CSV (*.csv)")
        if not path:
            return
        try:
            written = self.export_csv(path)
        except SpecDeckError as error:
            dialogs.show_error(self, "Export failed", f"{error}\nThe session's data is kept: try another folder.")
            return
        self.statusBar().showMessage("Wrote " + ", ".join(p.name for p in written))

    def _on_save_charts_clicked(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save charts", "specdeck-charts.png", "PNG (*.png)")
        if not path:
            return
        try:
            self.save_charts(path)
        except SpecDeckError as error:
            dialogs.show_error(self, "Saving the charts failed", str(error))

    # settings and closing ---------------------------------------------------------------------------

    def _restore_settings(self, settings: QSettings) -> None:
        self.model_panel.restore(settings)
        self.decoding_panel.restore(settings)
        self.bench_tab.restore(settings)
        self.tabs.setCurrentIndex(int(settings.value("window/tab", 0)))
        for key, widget in (("window/geometry", self), ("window/main_splitter", self.main_splitter),
                            ("window/right_splitter", self.right)):
            state = settings.value(key)
            if isinstance(state, QByteArray):
                (widget.restoreGeometry if widget is self else widget.restoreState)(state)

    def save_settings(self) -> None:
        if self.settings is None:
            return
        self.model_panel.save(self.settings)
        self.decoding_panel.save(self.settings)
        self.bench_tab.save(self.settings)
        self.settings.setValue("window/tab", self.tabs.currentIndex())
        self.settings.setValue("window/geometry", self.saveGeometry())
        self.settings.setValue("window/main_splitter", self.main_splitter.saveState())
        self.settings.setValue("window/right_splitter", self.right.saveState())
        self.settings.sync()

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt override
        """Stop any session, end the model thread and wait for it, so nothing outlives the window."""
        self.save_settings()
        for task in list(self._tasks):
            task.cancel()
        self.host.shutdown()
        super().closeEvent(event)
