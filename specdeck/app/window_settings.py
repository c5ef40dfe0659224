"""What the main window remembers between launches (QSettings): its panels' values, its menu
choices, its tab, its geometry and splitters; and fitting it on the screen it opens on.

A mixin of `MainWindow`, apart from its layout and slots because it is one job: a launch starts
where the last ended, on whatever screen it opens.
"""

from __future__ import annotations

from PySide6.QtCore import QByteArray, QRect, QSettings, QSize, QTimer
from PySide6.QtGui import QAction

FRAME_GUESS = QSize(8, 36)  # px a window manager's title bar and borders take, before they are known
FRAME_CHECKS_MS = (300, 1500)  # after the first show: when the frame is known, also on a busy machine


class WindowSettings:
    """The saved state of `MainWindow`, which has the panels, tabs and splitters it names."""

    _fitted_framed = False  # whether the fit after the first show is scheduled

    def _remembered_choices(self) -> tuple[tuple[str, QAction], ...]:
        return (
            ("export/per_token_rows", self.menus.per_token_rows),
            ("view/settings_panel", self.menus.settings_action),
            ("view/colour_blind_safe", self.menus.colour_blind_action),
        )

    def fit_into(self, area: QRect) -> None:
        """Shrink and move the window inside `area` (its screen's free part), so Run and Compare are
        on screen also where the default size or a geometry saved on a larger screen is too big.

        Before the window is shown its frame is unknown (the window manager adds it on mapping), so
        a usual title bar and border are set aside; `_on_frame_known` fits it again once the frame
        is known."""
        frame = self.frameGeometry().size() - self.geometry().size()  # the window manager's frame
        if not self.isVisible():
            frame = frame.expandedTo(FRAME_GUESS)
        width = max(min(self.width(), area.width() - frame.width()), self.minimumSizeHint().width())
        height = max(min(self.height(), area.height() - frame.height()), self.minimumSizeHint().height())
        self.resize(width, height)
        x = min(max(self.x(), area.left()), max(area.left(), area.right() + 1 - width - frame.width()))
        y = min(max(self.y(), area.top()), max(area.top(), area.bottom() + 1 - height - frame.height()))
        self.move(x, y)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if not self._fitted_framed:
            self._fitted_framed = True
            for delay in FRAME_CHECKS_MS:
                QTimer.singleShot(delay, self, self._on_frame_known)

    def _on_frame_known(self) -> None:
        """Fit the window again where its frame, now known, takes it past its screen's free part."""
        screen = self.screen()
        if screen is None or not self.isVisible() or self.isMaximized() or self.isFullScreen():
            return
        area = screen.availableGeometry()
        if not area.contains(self.frameGeometry()):
            self.fit_into(area)

    def _restore_settings(self, settings: QSettings) -> None:
        self.model_panel.restore(settings)
        self.decoding_panel.restore(settings)
        self.bench_tab.restore(settings)
        self.tabs.setCurrentIndex(int(settings.value("window/tab", 0)))
        for key, action in self._remembered_choices():
            action.setChecked(str(settings.value(key, action.isChecked())).lower() == "true")
        self.speculative_view.show_rejected.setChecked(
            str(settings.value("view/show_rejected", "true")).lower() == "true"
        )
        for key, widget in (
            ("window/geometry", self),
            ("window/main_splitter", self.main_splitter),
            ("window/right_splitter", self.right),
        ):
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
        for key, action in self._remembered_choices():
            self.settings.setValue(key, action.isChecked())
        self.settings.setValue("view/show_rejected", self.speculative_view.show_rejected.isChecked())
        self.settings.setValue("window/geometry", self.saveGeometry())
        self.settings.setValue("window/main_splitter", self.main_splitter.saveState())
        self.settings.setValue("window/right_splitter", self.right.saveState())
        self.settings.sync()
