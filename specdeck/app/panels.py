"""The decoding panel (`DecodingPanel`): how to decode, and the prompt with its presets; and the
spin boxes the settings forms are made of (the Benchmark tab's too).

It reads and writes its values through QSettings so that a launch starts where the last ended, as
the model panel (`model_panel`) does.
"""

from __future__ import annotations

from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from specdeck.engine.config import SCHEDULES, SUFFIX_SCOPES, DecodeConfig
from specdeck.engine.resources import resource_path


def load_presets() -> dict[str, str]:
    """Prompt presets: resources/presets/<name>.txt, by name. Lines are wrapped in the files; a blank
    line separates paragraphs, and an indented line or one inside a ``` fence (code) keeps its line
    break."""
    folder = resource_path("presets")
    if not folder.is_dir():
        return {}
    return {path.stem: _unwrap(path.read_text(encoding="utf-8")) for path in sorted(folder.glob("*.txt"))}


def _unwrap(text: str) -> str:
    out: list[str] = []
    fenced = False
    for line in text.strip().splitlines():
        fence = line.startswith("```")
        prose = not (fenced or fence) and line.strip() and not line.startswith((" ", "\t"))
        if prose and out and out[-1].strip() and not out[-1].startswith("```"):
            out[-1] = out[-1] + " " + line.strip()
        else:
            out.append(line.rstrip())
        fenced ^= fence
    return "\n".join(out)


class DecodingPanel(QGroupBox):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Decoding", parent)
        defaults = DecodeConfig()
        self.k = spin_box(1, 16, defaults.k)
        self.schedule = QComboBox()
        self.schedule.addItems(SCHEDULES)
        self.schedule.setCurrentText(defaults.schedule)
        self.lookup = spin_box(0, 16, defaults.lookup)
        self.lookup.setSpecialValueText("off")
        self.lookup.setToolTip(
            "Where the text repeats (a summary quoting its article, edited code), copy up to this "
            "many tokens from what followed the earlier occurrence instead of asking the drafter. "
            "Copies cost no model call and keep decoding exact."
        )
        self.suffix_scope = QComboBox()
        self.suffix_scope.addItems(SUFFIX_SCOPES)
        self.suffix_scope.setCurrentText(defaults.suffix_scope)
        self.suffix_scope.setToolTip(
            "What the suffix and hybrid drafters copy from: prompt, this request's text; "
            "session, also the answers written since SpecDeck started and the target's own "
            "texts (its answers to composed requests, made by specdeck suffix-texts; the built-in "
            "target's ship with SpecDeck); all, also past sessions' answers, kept in the cache "
            "folder (specdeck cache --clear forgets them)."
        )
        self.temperature = double_spin_box(0.0, 5.0, defaults.temperature, 0.1)
        self.temperature.setSpecialValueText("0 (greedy)")
        self.top_k = spin_box(0, 100000, defaults.top_k)
        self.top_k.setSpecialValueText("off")
        self.top_p = double_spin_box(0.01, 1.0, defaults.top_p, 0.05)
        self.seed = spin_box(0, 2**31 - 1, defaults.seed)
        self.max_new_tokens = spin_box(1, 8192, defaults.max_new_tokens)
        self.chat = QCheckBox("Chat template")
        self.chat.setChecked(True)
        self.truncate_prompt = QCheckBox("Keep a long prompt's end")
        self.truncate_prompt.setToolTip(
            "A prompt too long for the model's context is refused; checked, its start "
            "is dropped instead so that it and the answer fit."
        )
        self.presets = load_presets()
        self.preset = QComboBox()
        self.preset.addItems(list(self.presets))
        self.preset.activated.connect(self._on_preset_chosen)
        self.prompt = PromptEdit()
        self.prompt.setPlaceholderText("Type a prompt, or pick a preset. Ctrl+Enter runs it.")
        self.prompt.setMinimumHeight(90)
        if self.presets:
            self.prompt.setPlainText(next(iter(self.presets.values())))

        form = QFormLayout()
        row = QHBoxLayout()
        row.addWidget(self.k)
        row.addWidget(self.schedule, 1)
        form.addRow("K", row)
        row = QHBoxLayout()
        row.addWidget(self.lookup)
        row.addWidget(QLabel("copied tokens per round"), 1)
        form.addRow("Lookup", row)
        form.addRow("Suffix scope", self.suffix_scope)
        form.addRow("Temperature", self.temperature)
        row = QHBoxLayout()
        row.addWidget(self.top_k, 1)
        row.addWidget(QLabel("top-p"))
        row.addWidget(self.top_p, 1)
        form.addRow("top-k", row)
        row = QHBoxLayout()
        row.addWidget(self.seed, 1)
        row.addWidget(QLabel("max new"))
        row.addWidget(self.max_new_tokens, 1)
        form.addRow("Seed", row)
        row = QHBoxLayout()
        row.addWidget(self.chat)
        row.addWidget(self.truncate_prompt, 1)
        form.addRow(row)
        form.addRow("Preset", self.preset)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.prompt, 1)

    def _on_preset_chosen(self, index: int) -> None:
        self.prompt.setPlainText(self.presets[self.preset.itemText(index)])

    def choose_preset(self, name: str) -> None:
        self.preset.setCurrentText(name)
        self.prompt.setPlainText(self.presets[name])

    def config(self) -> DecodeConfig:
        """The settings as a DecodeConfig; raises SpecDeckError with the reason if they are invalid."""
        return DecodeConfig(
            k=self.k.value(),
            schedule=self.schedule.currentText(),
            lookup=self.lookup.value(),
            temperature=self.temperature.value(),
            top_k=self.top_k.value(),
            top_p=self.top_p.value(),
            seed=self.seed.value(),
            max_new_tokens=self.max_new_tokens.value(),
            truncate_prompt=self.truncate_prompt.isChecked(),
            suffix_scope=self.suffix_scope.currentText(),
        )

    def prompt_text(self) -> str:
        return self.prompt.toPlainText()

    def save(self, settings: QSettings) -> None:
        for name in ("k", "lookup", "top_k", "seed", "max_new_tokens"):
            settings.setValue(f"decoding/{name}", getattr(self, name).value())
        settings.setValue("decoding/temperature", self.temperature.value())
        settings.setValue("decoding/top_p", self.top_p.value())
        settings.setValue("decoding/schedule", self.schedule.currentText())
        settings.setValue("decoding/suffix_scope", self.suffix_scope.currentText())
        settings.setValue("decoding/chat", self.chat.isChecked())
        settings.setValue("decoding/prompt", self.prompt_text())

    def restore(self, settings: QSettings) -> None:
        for name in ("k", "lookup", "top_k", "seed", "max_new_tokens"):
            widget = getattr(self, name)
            widget.setValue(int(settings.value(f"decoding/{name}", widget.value())))
        self.temperature.setValue(float(settings.value("decoding/temperature", self.temperature.value())))
        self.top_p.setValue(float(settings.value("decoding/top_p", self.top_p.value())))
        self.schedule.setCurrentText(str(settings.value("decoding/schedule", self.schedule.currentText())))
        self.suffix_scope.setCurrentText(str(settings.value("decoding/suffix_scope", self.suffix_scope.currentText())))
        self.chat.setChecked(str(settings.value("decoding/chat", "true")).lower() == "true")
        prompt = settings.value("decoding/prompt", "")
        if prompt:
            self.prompt.setPlainText(str(prompt))


class PromptEdit(QPlainTextEdit):
    """The prompt box: Tab moves the focus on, as in any form; Ctrl+Tab inserts a tab character."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setTabChangesFocus(True)

    def keyPressEvent(self, event) -> None:
        if event.key() == Qt.Key.Key_Tab and event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            self.insertPlainText("\t")
            return
        super().keyPressEvent(event)


def spin_box(low: int, high: int, value: int) -> QSpinBox:
    spin = QSpinBox()
    spin.setRange(low, high)
    spin.setValue(value)
    return spin


def double_spin_box(low: float, high: float, value: float, step: float) -> QDoubleSpinBox:
    spin = QDoubleSpinBox()
    spin.setRange(low, high)
    spin.setDecimals(2)
    spin.setSingleStep(step)
    spin.setValue(value)
    return spin
