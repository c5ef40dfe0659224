"""The main window's menus and keyboard: the Session, File, View and Help menus, the shortcuts they
carry, and the event filter that lets those shortcuts win over a focused field's own keys.

A mixin of `MainWindow`, apart from its layout and slots because it is one job: which key does
what, as Help > Keyboard shortcuts lists it. The actions call the window's `_on_...` slots; those
of actions no button has (focus the prompt, hide the settings, the palette) are here.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QApplication, QWidget

from specdeck.app import dialogs


class WindowMenus:
    """The menus and shortcuts of `MainWindow`, which has the slots and panels they name."""

    def _build_menus(self) -> None:
        def action(name: str, slot, *keys: str, checkable: bool = False) -> QAction:
            """A menu action; its shortcuts work wherever the focus is in the window."""
            made = QAction(name, self, checkable=checkable)
            made.setShortcuts([QKeySequence(key) for key in keys])
            made.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
            (made.toggled if checkable else made.triggered).connect(slot)
            self.addAction(made)
            return made

        session = self.menuBar().addMenu("&Session")
        self.run_action = action("&Run", self._on_run_clicked, "Ctrl+Return", "Ctrl+Enter")
        self.compare_action = action("&Compare", self._on_compare_clicked, "Ctrl+Shift+Return", "Ctrl+Shift+Enter")
        self.stop_action = action("&Stop", self._on_stop_clicked, "Esc")
        self.replay_action = action("Re&play the compare run", self._on_replay_clicked, "Ctrl+R")
        focus = action("&Focus the prompt", self._on_focus_prompt, "Ctrl+L")
        session.addActions([self.run_action, self.compare_action, self.stop_action, self.replay_action, focus])

        file_menu = self.menuBar().addMenu("&File")
        self.export_action = action("&Export CSV…", self._on_export_clicked, "Ctrl+E")
        self.per_token_rows = QAction("Include per-token rows", self, checkable=True)
        charts = action("Save charts as &PNG…", self._on_save_charts_clicked)
        quit_action = action("&Quit", self.close, QKeySequence(QKeySequence.StandardKey.Quit).toString())
        # Ctrl+Q quits from any of SpecDeck's windows, the loading dialog and the replay included
        quit_action.setShortcutContext(Qt.ShortcutContext.ApplicationShortcut)
        file_menu.addActions([self.export_action, self.per_token_rows, charts])
        file_menu.addSeparator()
        file_menu.addAction(quit_action)

        view = self.menuBar().addMenu("&View")
        self.settings_action = action("&Settings panel", self._on_settings_toggled, "Ctrl+B", checkable=True)
        self.settings_action.setChecked(True)
        self.colour_blind_action = action("Colour-&blind safe palette", self._on_palette_toggled, checkable=True)
        view.addActions([self.settings_action, self.colour_blind_action])

        help_menu = self.menuBar().addMenu("&Help")
        shortcuts = action("&Keyboard shortcuts", lambda: dialogs.show_shortcuts(self, self.shortcut_list()), "F1")
        about = action(
            "&About SpecDeck", lambda: dialogs.show_about(self, self.host.pair.device if self.host.pair else None)
        )
        help_menu.addActions([shortcuts, about])
        self._window_keys = {key for made in self.actions() for key in made.shortcuts()}
        QApplication.instance().installEventFilter(self)

    def shortcut_list(self) -> list[tuple[str, str]]:
        """(keys, what they do) for every action with a shortcut, and for the prompt's Tab keys."""
        rows = [
            (
                ", ".join(key.toString(QKeySequence.SequenceFormat.NativeText) for key in made.shortcuts()),
                made.text().replace("&", "").rstrip("…"),
            )
            for made in self.actions()
            if made.shortcuts()
        ]
        return rows + [
            ("Tab, Shift+Tab", "Move the focus (also out of the prompt)"),
            ("Ctrl+Tab", "Insert a tab character in the prompt"),
        ]

    def eventFilter(self, watched, event) -> bool:
        """The window's shortcuts win over a focused field's own use of the keys (a line edit takes
        Ctrl+E to mean end of line): a field is not offered a key the window has a shortcut for."""
        if (
            event.type() == QEvent.Type.ShortcutOverride
            and isinstance(watched, QWidget)
            and watched.window() is self
            and QKeySequence(event.keyCombination()) in self._window_keys
        ):
            return True
        return super().eventFilter(watched, event)

    # the slots of actions only the menus carry ------------------------------------------------------

    def _on_focus_prompt(self) -> None:
        self.settings_action.setChecked(True)
        self._on_settings_toggled(True)
        self.decoding_panel.prompt.setFocus(Qt.FocusReason.ShortcutFocusReason)

    def _on_settings_toggled(self, shown: bool) -> None:
        self.settings_panel.setVisible(shown)

    def _on_palette_toggled(self, safe: bool) -> None:
        palette = "colour-blind safe" if safe else "standard"
        self.legend.refresh(palette)
        for view in (self.speculative_view, self.plain_view):
            view.set_palette(palette)
