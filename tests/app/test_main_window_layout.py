"""The window fits a laptop: its minimum size, charts that reflow instead of clipping, a settings
panel that collapses."""

from __future__ import annotations

SMALL_SCREEN = (1024, 700)
TITLE_BAR = 40  # what a window manager's frame takes of the screen's height, about


def _run(qtbot, window, button) -> None:
    button.click()
    qtbot.waitUntil(lambda: window.idle, timeout=60_000)


def test_window_fits_a_1024_by_700_screen_before_and_after_a_compare(qtbot, window):
    """The minimum size stays within a 1024x700 screen, also once a compare run filled the views."""
    for _ in range(2):
        hint = window.minimumSizeHint()
        assert hint.width() <= SMALL_SCREEN[0] and hint.height() <= SMALL_SCREEN[1] - TITLE_BAR, hint
        _run(qtbot, window, window.compare_button)


def test_charts_reflow_and_keep_their_size_on_a_small_screen(qtbot, window):
    """At 1024x700 the charts take fewer columns (the rest scrolls) and none is narrower or lower
    than it needs for its axes; wide, three columns with the figures beside them."""
    from specdeck.app.chart_plot import CHART_HEIGHT, CHART_WIDTH

    window.resize(*SMALL_SCREEN)
    qtbot.waitUntil(lambda: window.charts._place is not None and window.charts._place[0] < 3, timeout=2000)
    for plot in window.charts.plots:
        assert plot.width() >= CHART_WIDTH - 20 and plot.height() >= CHART_HEIGHT
    window.resize(1920, 1080)
    qtbot.waitUntil(lambda: window.charts._place[:2] == (3, True), timeout=2000)


def test_settings_panel_collapses_and_comes_back(qtbot, window):
    """View > Settings panel hides the left column (the views take its room) and shows it again."""
    window.resize(1366, 768)
    before = window.tabs.width()
    window.menus.settings_action.trigger()
    qtbot.waitUntil(lambda: window.tabs.width() > before, timeout=2000)
    assert not window.settings_panel.isVisible()
    window.menus.settings_action.trigger()
    assert window.settings_panel.isVisible() and window.run_button.isVisible()


def test_window_opens_inside_a_1366_by_768_screen(qtbot, window):
    """A window sized or saved for a larger screen is fitted inside a 1366x768 one, with Run and
    Compare on the screen."""
    from PySide6.QtCore import QPoint, QRect

    screen = QRect(0, 0, 1366, 768)
    window.resize(1920, 1200)
    window.move(400, 300)
    window.fit_into(screen)
    window.show()
    assert screen.contains(window.frameGeometry()), window.frameGeometry()
    for button in (window.run_button, window.compare_button):
        corner = button.mapToGlobal(QPoint(button.width() - 1, button.height() - 1))
        assert button.isVisible() and screen.contains(button.mapToGlobal(QPoint(0, 0))) and screen.contains(corner)


def test_the_benchmark_tabs_plan_and_run_button_show_on_a_small_screen(qtbot, window):
    """At 1024x700 the Benchmark tab's options scroll, but what Run benchmark will do, the button
    itself and the progress stay in view."""
    bench = window.bench_tab
    window.resize(*SMALL_SCREEN)
    window.tabs.setCurrentWidget(bench)
    qtbot.waitUntil(lambda: "timed runs" in bench.plan_note.text(), timeout=5000)
    for shown in (bench.plan_note, bench.run_button, bench.progress, bench.stage):
        qtbot.waitUntil(lambda shown=shown: not shown.visibleRegion().isEmpty(), timeout=2000)
        assert shown.visibleRegion().boundingRect().height() == shown.height(), shown
