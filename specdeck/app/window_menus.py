"""The main window's menus and keyboard (`WindowMenus`): the Session, File, View and Help menus,
the shortcuts they carry, and the event filter that lets those shortcuts win over a focused
field's own keys (on the focused widget alone: `_on_focus_changed`).

A component the window owns (`MainWindow.menus`), apart from its layout and slots because it is
one job: which key does what, as Help > Keyboard shortcuts lists it. Its actions call the
window's `_on_...` slots; those of actions no button has (focus the prompt, hide the settings,
the palette) are here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QApplication, QWidget

from specdeck.app import dialogs

if TYPE_CHECKING:
    from specdeck.app.main_window import MainWindow


class WindowMenus(QObject):
    """The menus and shortcuts of `window`; the actions the window enables, checks or saves are
    attributes (`run_action`, `per_token_rows`, `settings_action`, ...)."""

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.window = window
        bar = window.menuBar()

        session = bar.addMenu("&Session")
        self.run_action = self._action("&Run", window._on_run_clicked, "Ctrl+Return", "Ctrl+Enter")
        self.compare_action = self._action(
            "&Compare", window._on_compare_clicked, "Ctrl+Shift+Return", "Ctrl+Shift+Enter"
        )
        self.stop_action = self._action("&Stop", window._on_stop_clicked, "Esc")
        self.replay_action = self._action("Re&play the compare run", window._on_replay_clicked, "Ctrl+R")
        focus = self._action("&Focus the prompt", self._on_focus_prompt, "Ctrl+L")
        session.addActions([self.run_action, self.compare_action, self.stop_action, self.replay_action, focus])

        file_menu = bar.addMenu("&File")
        self.export_action = self._action("&Export CSV…", window._on_export_clicked, "Ctrl+E")
        self.per_token_rows = QAction("Include per-token rows", window, checkable=True)
        charts = self._action("Save charts as &PNG…", window._on_save_charts_clicked)
        self.quit_action = self._action("&Quit", window.close, QKeySequence(QKeySequence.StandardKey.Quit).toString())
        # Ctrl+Q quits from any of SpecDeck's windows, the loading dialog and the replay included
        self.quit_action.setShortcutContext(Qt.ShortcutContext.ApplicationShortcut)
        file_menu.addActions([self.export_action, self.per_token_rows, charts])
        file_menu.addSeparator()
        file_menu.addAction(self.quit_action)

        view = bar.addMenu("&View")
        self.settings_action = self._action("&Settings panel", self._on_settings_toggled, "Ctrl+B", checkable=True)
        self.settings_action.setChecked(True)
        self.colour_blind_action = self._action("Colour-&blind safe palette", self._on_palette_toggled, checkable=True)
        view.addActions([self.settings_action, self.colour_blind_action])

        help_menu = bar.addMenu("&Help")
        shortcuts = self._action(
            "&Keyboard shortcuts", lambda: dialogs.show_shortcuts(window, self.shortcut_list()), "F1"
        )
        about = self._action(
            "&About SpecDeck", lambda: dialogs.show_about(window, window.host.pair.device if window.host.pair else None)
        )
        help_menu.addActions([shortcuts, about])
        self._window_keys = {key for made in window.actions() for key in made.shortcuts()}
        # the filter watches the focused widget, not the application: an application's filter runs
        # Python for every event of every object (the busy bar's animation, the charts' repaints),
        # hundreds a second, each taking the interpreter from the model thread while it imports
        # torch or decodes; a key goes to the focused widget first, so filtering it alone suffices
        self._filtered: QWidget | None = None
        self._watching_focus = True
        cast(QApplication, QApplication.instance()).focusChanged.connect(self._on_focus_changed)
        self._on_focus_changed(None, QApplication.focusWidget())

    def _action(self, name: str, slot, *keys: str, checkable: bool = False) -> QAction:
        """A menu action of the window; its shortcuts work wherever the focus is in the window."""
        made = QAction(name, self.window, checkable=checkable)
        made.setShortcuts([QKeySequence(key) for key in keys])
        made.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        (made.toggled if checkable else made.triggered).connect(slot)
        self.window.addAction(made)
        return made

    def shortcut_list(self) -> list[tuple[str, str]]:
        """(keys, what they do) for every action with a shortcut, and for the prompt's Tab keys."""
        rows = [
            (
                ", ".join(key.toString(QKeySequence.SequenceFormat.NativeText) for key in made.shortcuts()),
                made.text().replace("&", "").rstrip("…"),
            )
            for made in self.window.actions()
            if made.shortcuts()
        ]
        return rows + [
            ("Tab, Shift+Tab", "Move the focus (also out of the prompt)"),
            ("Ctrl+Tab", "Insert a tab character in the prompt"),
        ]

    def _on_focus_changed(self, old: QWidget | None, new: QWidget | None) -> None:
        """Filter the keys of the widget that has the focus now, and only of it."""
        if self._filtered is not None:
            self._filtered.removeEventFilter(self)
            self._filtered.destroyed.disconnect(self._on_filtered_destroyed)
            self._filtered = None
        if new is not None and new.window() is self.window:
            new.installEventFilter(self)
            new.destroyed.connect(self._on_filtered_destroyed)
            self._filtered = new

    def _on_filtered_destroyed(self) -> None:
        self._filtered = None

    def eventFilter(self, watched, event) -> bool:
        """The window's shortcuts win over a focused field's own use of the keys (a line edit takes
        Ctrl+E to mean end of line): a field is not offered a key the window has a shortcut for."""
        if (
            event.type() == QEvent.Type.ShortcutOverride
            and isinstance(watched, QWidget)
            and watched.window() is self.window
            and QKeySequence(event.keyCombination()) in self._window_keys
        ):
            return True
        return super().eventFilter(watched, event)

    def detach(self) -> None:
        """Stop filtering the focused widget's keys (the window closes; a second close does nothing)."""
        if self._watching_focus:
            self._watching_focus = False
            cast(QApplication, QApplication.instance()).focusChanged.disconnect(self._on_focus_changed)
            self._on_focus_changed(None, None)

    # the slots of actions only the menus carry ------------------------------------------------------

    def _on_focus_prompt(self) -> None:
        self.settings_action.setChecked(True)
        self._on_settings_toggled(True)
        self.window.decoding_panel.prompt.setFocus(Qt.FocusReason.ShortcutFocusReason)

    def _on_settings_toggled(self, shown: bool) -> None:
        self.window.settings_panel.setVisible(shown)

    def _on_palette_toggled(self, safe: bool) -> None:
        palette = "colour-blind safe" if safe else "standard"
        self.window.legend.refresh(palette)
        for view in (self.window.speculative_view, self.window.plain_view):
            view.set_palette(palette)
