"""The main window: settings panels on the left; on the right, a Session tab (token views and
charts) and a Benchmark tab (the `specdeck bench` harness on the loaded pair).

The window lays out the views, reads the panels when a button is pressed and hands the values to
the `SessionController`; the views follow the `SessionModel`. It opens the dialogs; its menus and
shortcuts are the `WindowMenus` it owns (`window_menus`, as `menus`), what it remembers between
launches `WindowSettings` (`window_settings`).

The window imports only Qt, pyqtgraph and the engine's plain-Python modules; once painted it has
the model thread import the engine (torch, transformers: under way since the launch, where
`specdeck gui` started it), with "Starting the engine" and the busy bar in the status bar meanwhile
(`ModelHost.start_engine`). Run pressed before that waits for it.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, QSettings, Qt, QTimer
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QProgressBar,
    QProgressDialog,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from specdeck.app import dialogs
from specdeck.app.bench_tab import BenchmarkTab
from specdeck.app.charts import SessionCharts
from specdeck.app.controller import SessionController
from specdeck.app.model_host import STARTING, ModelHost
from specdeck.app.model_panel import ModelPanel
from specdeck.app.panels import DecodingPanel
from specdeck.app.replay import ReplayDialog
from specdeck.app.session_model import Activity, SessionModel
from specdeck.app.token_view import Legend, TokenView
from specdeck.app.window_menus import WindowMenus
from specdeck.app.window_settings import WindowSettings
from specdeck.app.worker import PairInfo
from specdeck.engine.atomic import write_with
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.events import SummaryEvent
from specdeck.engine.export import SessionRecord

MIN_TEXT_HEIGHT = 130  # px of the token views: a few lines of text beside the charts
CLOSE_WAIT_MS = 1000  # the longest a close waits for the model thread: the app ends within 2 s
WAITING_WIDTH = 120  # px of the status bar's busy indicator
MEASURING = "Text done; measuring this machine's forward costs for the next sessions' plans…"
READY = "Load a model pair, then Run or Compare."  # the status bar's line once the engine is there
PROGRESS_WIDTH = 520  # px of the loading dialog: room for a stage's name in two lines


def save_picture(widget: QWidget, path: str | Path) -> None:
    """Save what `widget` shows as an image (format from the suffix, PNG without one), whole or not
    at all (`specdeck.engine.atomic`); raises SpecDeckError."""
    image = widget.grab()
    kind = Path(path).suffix.lstrip(".").upper() or "PNG"

    def save(temporary: Path) -> None:
        if not image.save(str(temporary), kind):
            raise OSError(f"Qt could not write a {kind} image")

    write_with(path, save)


class MainWindow(WindowSettings, QMainWindow):
    def __init__(self, settings: QSettings | None = None, host: ModelHost | None = None) -> None:
        super().__init__()
        self.setWindowTitle("SpecDeck")
        self.settings = settings
        self.host = host or ModelHost()
        self.host.setParent(self)
        self.session_model = SessionModel()
        self.controller = SessionController(self.host, self.session_model)
        model = self.session_model

        self.model_panel = ModelPanel(model)
        self.model_panel.load_clicked.connect(self._on_load_clicked)
        self.decoding_panel = DecodingPanel()
        self.run_button = QPushButton("Run")
        self.stop_button = QPushButton("Stop")
        self.compare_button = QPushButton("Compare")
        self.compare_button.setToolTip("Speculative, then plain decoding on the same prompt and settings")
        self.export_button = QPushButton("Export…")
        self.export_button.setToolTip("Write the last run's rounds (and tokens) as CSV, with its settings as JSON")
        self.run_button.clicked.connect(self._on_run_clicked)
        self.stop_button.clicked.connect(self._on_stop_clicked)
        self.compare_button.clicked.connect(self._on_compare_clicked)
        self.export_button.clicked.connect(self._on_export_clicked)

        self.speculative_view = TokenView("Speculative", model, "speculative")
        self.plain_view = TokenView("Plain", model, "plain")
        self.charts = SessionCharts(model)
        self.legend = Legend()
        self.verdict = QLabel()  # a compare run's verdict, or why a run ended early
        self.verdict.setTextFormat(Qt.TextFormat.RichText)
        self.verdict.setWordWrap(True)
        self.replay_button = QPushButton("Replay the race")
        self.replay_button.setToolTip("Both sessions of the last Compare side by side at their measured pace (Ctrl+R)")
        self.replay_button.clicked.connect(self._on_replay_clicked)
        self.replay: ReplayDialog | None = None
        self.bench_tab = BenchmarkTab(model)
        self.bench_tab.run_button.clicked.connect(self._on_bench_clicked)
        self.bench_tab.cancel_button.clicked.connect(self.controller.cancel_benchmark)
        self.host.load_progress.connect(self._on_load_progress)
        self.host.engine_started.connect(self._on_engine_started)
        self.host.bench_progress.connect(self.bench_tab.show_progress)
        self.bench_tab.options_changed.connect(self._on_bench_options_changed)
        model.activity_changed.connect(self._on_activity_changed)
        model.run_started.connect(self._on_run_started)
        model.run_ended.connect(self._on_run_ended)
        model.status.connect(self.statusBar().showMessage)
        # moving while a load or a session's start (prefill, measuring costs) shows nothing else
        # moving; hidden from the first token on, when the text itself moves
        self.waiting = QProgressBar()
        self.waiting.setRange(0, 0)
        self.waiting.setMaximumWidth(WAITING_WIDTH)
        self.waiting.setTextVisible(False)
        self.waiting.hide()
        self.statusBar().addPermanentWidget(self.waiting)
        model.events_arrived.connect(self._on_events_arrived)
        self._build_layout()
        self.menus = WindowMenus(self)

        self._progress: QProgressDialog | None = None
        self.model_thread_ended = True  # False after a close that left a load's stage running
        self._on_activity_changed(model.activity)
        self.installEventFilter(self)  # until the first paint, which starts the engine
        self.resize(1440, 900)
        if settings is not None:
            self._restore_settings(settings)
        screen = self.screen()
        if screen is not None:
            self.fit_into(screen.availableGeometry())

    # layout -----------------------------------------------------------------------------------------

    def _build_layout(self) -> None:
        panels = QWidget()
        column = QVBoxLayout(panels)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(self.model_panel)
        column.addWidget(self.decoding_panel, 1)
        scroll = QScrollArea()
        scroll.setWidget(panels)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        buttons = QHBoxLayout()  # below the scrolling panels: always in view
        for button in (self.run_button, self.stop_button, self.compare_button, self.export_button):
            buttons.addWidget(button)
        self.settings_panel = QWidget()
        left = QVBoxLayout(self.settings_panel)
        left.setContentsMargins(4, 4, 4, 4)
        left.addWidget(scroll, 1)
        left.addLayout(buttons)
        scrollbar = scroll.verticalScrollBar().sizeHint().width()
        self.settings_panel.setMinimumWidth(panels.minimumSizeHint().width() + scrollbar + 8)

        self.views = QSplitter(Qt.Orientation.Horizontal)
        self.views.addWidget(self.speculative_view)
        self.views.addWidget(self.plain_view)
        self.views.setChildrenCollapsible(False)
        top = QWidget()
        top_layout = QVBoxLayout(top)
        top_layout.setContentsMargins(4, 4, 4, 4)
        legend_row = QHBoxLayout()
        legend_row.addWidget(self.legend)
        legend_row.addStretch(1)
        top_layout.addLayout(legend_row)
        top_layout.addWidget(self.views, 1)
        # below the texts, across both, outside the charts' scrolling: the figures a session is
        # run for, and a compare run's verdict, in view on any screen
        figures_row = QHBoxLayout()
        figures_row.addWidget(self.charts.headline, 1)
        figures_row.addWidget(self.replay_button)
        top_layout.addLayout(figures_row)
        top_layout.addWidget(self.verdict)
        top.setMinimumHeight(MIN_TEXT_HEIGHT)

        charts = QScrollArea()  # the charts keep a size that shows their axes whole, and scroll below it
        charts.setWidget(self.charts)
        charts.setWidgetResizable(True)
        charts.setFrameShape(QScrollArea.Shape.NoFrame)
        charts.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        charts.setMinimumHeight(MIN_TEXT_HEIGHT)
        self.right = QSplitter(Qt.Orientation.Vertical)
        self.right.addWidget(top)
        self.right.addWidget(charts)
        self.right.setChildrenCollapsible(False)
        self.right.setSizes([350, 450])
        self.tabs = QTabWidget()
        self.tabs.addTab(self.right, "Session")
        self.tabs.addTab(self.bench_tab, "Benchmark")
        self.tabs.currentChanged.connect(self._on_tab_changed)
        self.main_splitter = QSplitter(Qt.Orientation.Horizontal)
        self.main_splitter.addWidget(self.settings_panel)
        self.main_splitter.addWidget(self.tabs)
        self.main_splitter.setCollapsible(1, False)  # the settings collapse (View > Settings panel), the views never
        self.main_splitter.setStretchFactor(1, 1)
        self.main_splitter.setSizes([self.settings_panel.minimumWidth(), 1000])
        self.setCentralWidget(self.main_splitter)
        self.statusBar().showMessage(READY if self.host.engine_ready else STARTING)

    # what the buttons start -------------------------------------------------------------------------

    async def load_models(self) -> PairInfo:
        """Load the pair the model panel names."""
        return await self.controller.load(self.model_panel.spec())

    async def run(self, compare: bool = False) -> None:
        """Run (or compare) with the panels' settings; raises SpecDeckError if they are invalid."""
        config = self.decoding_panel.config()
        versions = dialogs.qt_versions()
        await self.controller.run(
            self.model_panel.spec(),
            self.decoding_panel.prompt_text(),
            config,
            self.decoding_panel.chat.isChecked(),
            compare,
            versions,
        )

    async def run_benchmark(self) -> None:
        """The Benchmark tab's harness on the model panel's pair; the tab shows progress and results."""
        tab, spec = self.bench_tab, self.model_panel.spec()
        prompts, settings = tab.prompts(), tab.settings()
        drafters, command = tuple(tab.other_drafters(spec)), tab.command_line(spec)
        tab.start()
        try:
            outcome = await self.controller.benchmark(spec, prompts, settings, str(tab.prompt_file), command, drafters)
        except SpecDeckError:
            tab.show_stopped("The benchmark failed.")
            raise
        if outcome is None:
            tab.show_stopped("The benchmark was cancelled.")
        else:
            tab.show_outcome(outcome)

    def export_csv(self, path: str | Path) -> list[Path]:
        """Write the last run's round CSV and metadata (and token rows if chosen); raises SpecDeckError."""
        return self.session_model.export(path, per_token=self.menus.per_token_rows.isChecked())

    def save_charts(self, path: str | Path) -> None:
        save_picture(self.charts, path)

    @property
    def idle(self) -> bool:
        return self.controller.idle

    # slots ------------------------------------------------------------------------------------------

    def _spawn(self, coroutine, title: str) -> None:
        def on_error(message: str) -> None:
            self.statusBar().showMessage(title)
            dialogs.show_error(self, title, message)

        self.controller.spawn(coroutine, on_error)

    def _on_tab_changed(self, index: int) -> None:
        """The decoding settings apply to Run and Compare, not to the benchmark: they are greyed out
        while the Benchmark tab shows, and its plan is brought up to date."""
        benchmark = self.tabs.widget(index) is self.bench_tab
        self.decoding_panel.setEnabled(not benchmark)
        self.decoding_panel.setTitle("Decoding: Run and Compare only" if benchmark else "Decoding")
        if benchmark:
            self._on_bench_options_changed()

    def _on_bench_options_changed(self) -> None:
        measured = self.session_model.summary("plain") or self.session_model.summary("speculative")
        self.bench_tab.show_plan(self.model_panel.spec(), measured.tokens_per_s if measured else None)

    def _show_session_tab(self) -> None:
        self.tabs.setCurrentWidget(self.right)

    def _on_load_clicked(self) -> None:
        self._spawn(self.load_models(), "Could not load the models")

    def _on_run_clicked(self) -> None:
        self._show_session_tab()
        self._spawn(self.run(compare=False), "The session failed")

    def _on_compare_clicked(self) -> None:
        self._show_session_tab()
        self._spawn(self.run(compare=True), "The compare run failed")

    def _on_bench_clicked(self) -> None:
        self._spawn(self.run_benchmark(), "The benchmark failed")

    def _on_stop_clicked(self) -> None:
        if self.session_model.activity.running:
            self.controller.stop()

    def replayable_records(self) -> tuple[SessionRecord, SessionRecord] | None:
        """The last Compare's speculative and plain records, once both ended; None otherwise."""
        by_mode = {r.mode: r for r in self.session_model.records if r.summary is not None}
        if self.session_model.activity.running or set(by_mode) != {"speculative", "plain"}:
            return None
        return by_mode["speculative"], by_mode["plain"]

    def _on_replay_clicked(self) -> None:
        records = self.replayable_records()
        if records is None:
            return
        if self.replay is not None:
            self.replay.close()
        self.replay = ReplayDialog(*records, parent=self)
        self.replay.show()

    def eventFilter(self, watched, event) -> bool:
        """The window's first paint starts the engine's import in the model thread, on the event
        loop's next turn (it finds the import `specdeck gui` started at launch done or under way,
        and waits for the rest): the window is on screen by then. The filter then goes, so that no
        later paint (the busy bar's, many a second) runs Python code in the GUI thread."""
        if watched is self and event.type() == QEvent.Type.Paint:
            self.removeEventFilter(self)
            QTimer.singleShot(0, self.host.start_engine)
        return False

    def _on_engine_started(self, failure: str) -> None:
        self._on_activity_changed(self.session_model.activity)
        if failure:
            self.statusBar().showMessage(failure)
        elif not self.session_model.activity.busy:
            self.statusBar().showMessage(READY)

    def _on_events_arrived(self, record, batch: tuple) -> None:
        if any(isinstance(event, SummaryEvent) for event in batch) and self.session_model.activity.running:
            # the text is whole; the session may still measure this machine's forward costs for the
            # plans of the sessions after it (seconds, the first time): moving, and said
            self.waiting.show()
            self.statusBar().showMessage(MEASURING)
        elif self.waiting.isVisible() and record.tokens:
            self.waiting.hide()

    def _on_activity_changed(self, activity: Activity) -> None:
        busy = activity.busy
        self.waiting.setVisible(activity.loading or activity.running or self.host.engine_pending)
        for widget in (
            self.run_button,
            self.compare_button,
            self.model_panel.load_button,
            self.menus.run_action,
            self.menus.compare_action,
        ):
            widget.setEnabled(not busy)
        self.stop_button.setEnabled(activity.running)
        exportable = not busy and bool(self.session_model.records)
        self.export_button.setEnabled(exportable)
        self.menus.export_action.setEnabled(exportable)
        replayable = self.replayable_records() is not None
        self.menus.replay_action.setEnabled(replayable)
        self.replay_button.setVisible(replayable)
        if activity.loading and self._progress is None:
            self._open_progress()
        elif not activity.loading and self._progress is not None:
            self._progress.canceled.disconnect(self.controller.cancel_load)
            self._progress.close()
            self._progress.deleteLater()
            self._progress = None

    def _open_progress(self) -> None:
        """A cancellable dialog that names each stage of the load, over the middle of the window.

        Not modal: the window's close button and Ctrl+Q must still reach the window during a load
        (what would start another load is disabled while one runs). Its width is fixed and its
        label wraps, so a long stage name never resizes it: a dialog the window manager is asked
        to resize while the model thread holds the interpreter loses its frame and place."""
        progress = QProgressDialog("Loading…", "Cancel", 0, 0, self)
        progress.setWindowTitle("Loading models")
        progress.setWindowModality(Qt.WindowModality.NonModal)
        progress.setMinimumDuration(0)
        progress.setAutoClose(False)
        progress.setAutoReset(False)
        label = QLabel("Loading…")
        label.setWordWrap(True)
        label.setMinimumHeight(3 * label.fontMetrics().lineSpacing())
        progress.setLabel(label)
        progress.setFixedWidth(PROGRESS_WIDTH)
        progress.setFixedHeight(progress.sizeHint().height())
        progress.canceled.connect(self.controller.cancel_load)
        centre = self.frameGeometry().center()
        progress.move(centre.x() - PROGRESS_WIDTH // 2, centre.y() - progress.height() // 2)
        self._progress = progress
        progress.show()

    def _on_load_progress(self, stage: str) -> None:
        if self._progress is not None:
            self._progress.setLabelText(stage)
        self.statusBar().showMessage(stage)

    def _on_run_started(self, compare: bool) -> None:
        self.verdict.clear()

    def _on_run_ended(self) -> None:
        """The run's verdict below the texts: a compare run's measured speedup and, for greedy runs,
        whether the two texts are the same; a stopped run says so."""
        verdict = self.session_model.verdict()
        self.verdict.setText(verdict.html() if verdict is not None else "")

    def _on_export_clicked(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Export session statistics", str(dialogs.start_folder() / "specdeck-session.csv"), "CSV (*.csv)"
        )
        if not path:
            return
        try:
            written = self.export_csv(path)
        except SpecDeckError as error:
            dialogs.show_error(self, "Export failed", f"{error}\nThe session's data is kept: try another folder.")
            return
        self.statusBar().showMessage("Wrote " + ", ".join(p.name for p in written))

    def _on_save_charts_clicked(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Save charts", str(dialogs.start_folder() / "specdeck-charts.png"), "PNG (*.png)"
        )
        if not path:
            return
        try:
            self.save_charts(path)
        except SpecDeckError as error:
            dialogs.show_error(self, "Saving the charts failed", str(error))

    # closing ----------------------------------------------------------------------------------------

    def closeEvent(self, event) -> None:
        """Save what the window remembers, then stop any load or session and end the model thread,
        waiting for it at most `CLOSE_WAIT_MS`: the window goes at once, and where the thread is
        still inside one stage of a load, `model_thread_ended` says so and `specdeck gui` ends the
        process without it (`specdeck.app.main`). Nothing is lost: exports and caches are written whole or
        not at all."""
        self.menus.detach()
        self.save_settings()
        if self._progress is not None:
            self._progress.close()
        self.hide()
        self.model_thread_ended = self.controller.shutdown(CLOSE_WAIT_MS)
        super().closeEvent(event)
