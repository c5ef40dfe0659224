"""The two settings panels: which models to load (`ModelPanel`) and how to decode (`DecodingPanel`).

Both read and write their values through QSettings so that a launch starts where the last ended.
"""

from __future__ import annotations

from html import escape

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from specdeck.app.session_model import SessionModel
from specdeck.engine.config import SCHEDULES, SUFFIX_SCOPES, DecodeConfig
from specdeck.engine.loading.backends import BACKENDS
from specdeck.engine.loading.registry import BUILTIN_MODELS, DEFAULT_TARGET
from specdeck.engine.pair import DrafterKind, PairSpec
from specdeck.engine.remote.remote_http import API_KEY_VARIABLE
from specdeck.engine.resources import resource_path

DRAFTER_KINDS = tuple(DrafterKind)  # in the drafter combo's order
DEFAULT_DRAFTER_TIP = (
    "Left as it opens, the built-in target's drafter follows what runs it: its feature head on torch, "
    "the suffix drafter on llama.cpp, where a verify costs about a step per token and only long copies pay"
)
BUILTIN_DRAFTS = {kind.builtin_model(DEFAULT_TARGET) for kind in DrafterKind} - {None}
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "bfloat16", "float16")
RECENT_LIMIT = 10
WRONG_FIELD_STYLE = "border: 2px solid #c62828;"


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


class ModelPicker(QWidget):
    """An editable combo (built-in aliases, then recently used ids and paths) with Browse..."""

    def __init__(self, allow_empty: bool = False, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.combo = QComboBox()
        self.combo.setEditable(True)
        self.combo.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        self.combo.setMinimumContentsLength(12)
        self.combo.lineEdit().setPlaceholderText("alias, Hugging Face id, folder or .gguf")
        self._allow_empty = allow_empty
        self.browse = QToolButton()
        self.browse.setText("Browse…")
        self.browse.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        menu = QMenu(self.browse)
        folder, gguf = QAction("Model folder…", menu), QAction(".gguf file…", menu)
        folder.triggered.connect(self._on_browse_folder)
        gguf.triggered.connect(self._on_browse_gguf)
        menu.addActions([folder, gguf])
        self.browse.setMenu(menu)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.combo, 1)
        layout.addWidget(self.browse)
        self.set_recent([])

    def set_recent(self, recent: list[str]) -> None:
        text = self.combo.currentText()
        self.combo.clear()
        if self._allow_empty:
            self.combo.addItem("")
        self.combo.addItems(list(BUILTIN_MODELS) + [r for r in recent if r not in BUILTIN_MODELS])
        self.combo.setCurrentText(text)

    @property
    def value(self) -> str:
        return self.combo.currentText().strip()

    def set_value(self, value: str) -> None:
        self.combo.setCurrentText(value)

    def _on_browse_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Choose a model folder")
        if path:
            self.combo.setCurrentText(path)

    def _on_browse_gguf(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model", "", "GGUF models (*.gguf)")
        if path:
            self.combo.setCurrentText(path)


class ModelPanel(QGroupBox):
    """Which pair to load. Given a `SessionModel`, it shows the resident pair or why the last load
    failed, with the field to blame outlined."""

    load_clicked = Signal()

    def __init__(self, model: SessionModel | None = None, parent: QWidget | None = None) -> None:
        super().__init__("Models", parent)
        self._model = model
        self.target = ModelPicker()
        self.drafter = QComboBox()
        for index, kind in enumerate(DRAFTER_KINDS):
            self.drafter.addItem(kind.label)
            self.drafter.setItemData(index, kind.description, Qt.ItemDataRole.ToolTipRole)
        self.draft = ModelPicker(allow_empty=True)
        # the layer-skip drafter's first layers; 0 (shown as "measured"): the count measured to pay best
        self.draft_layers = QSpinBox()
        self.draft_layers.setRange(0, 999)
        self.draft_layers.setSpecialValueText("measured")
        self.draft_layers.setToolTip(
            "Layer skip drafts with the target's first N layers; measured: the count whose agreement "
            "and cost promise the best speedup, measured once per model and machine"
        )
        self.served_model = QLineEdit()  # a served target's model name, where Target is a server's address
        self.served_model.setPlaceholderText("model name on the server, when Target is http://HOST:PORT/v1")
        self.served_model.setToolTip(
            "A target served over an OpenAI-compatible API: put its address in Target "
            f"and its model name here (API key from {API_KEY_VARIABLE}; greedy only)."
        )
        self.device = QComboBox()
        self.device.setEditable(True)
        self.device.addItems(DEVICES)
        self.dtype = QComboBox()
        self.dtype.addItems(DTYPES)
        self.backend = QComboBox()
        self.backend.addItems(BACKENDS)
        self.backend.setToolTip(
            "What runs a .gguf model: llama.cpp on its quantized weights, torch on them "
            "dequantized, or auto: llama.cpp where it is installed and faster on this machine"
        )
        self.trust_remote_code = QCheckBox("Trust remote code")
        self.trust_remote_code.setToolTip("Run Python code shipped with the model's files. Only for models you trust.")
        self.load_button = QPushButton("Load")
        self.load_button.clicked.connect(self.load_clicked)
        self.loaded = QLabel("No models loaded.")
        self.loaded.setWordWrap(True)
        self.loaded.setTextFormat(Qt.TextFormat.RichText)
        self.loaded.setStyleSheet("color: #555;")
        self.drafter.currentIndexChanged.connect(self._on_drafter_changed)
        self.drafter.activated.connect(self._on_drafter_picked)
        self.drafter.setToolTip(DEFAULT_DRAFTER_TIP)
        self._drafter_picked = False  # whether the user chose the drafter (else the default pair's)
        form = QFormLayout(self)
        form.addRow("Target", self.target)
        form.addRow("Served as", self.served_model)
        form.addRow("Drafter", self.drafter)
        draft_row = QHBoxLayout()
        draft_row.addWidget(self.draft, 1)
        self._layers_label = QLabel("layers")
        draft_row.addWidget(self._layers_label)
        draft_row.addWidget(self.draft_layers)
        form.addRow("Draft", draft_row)
        self._show_layers(self.drafter_kind is DrafterKind.LAYER_SKIP)
        row = QHBoxLayout()
        row.addWidget(self.device, 1)
        row.addWidget(QLabel("dtype"))
        row.addWidget(self.dtype, 1)
        row.addWidget(QLabel("backend"))
        row.addWidget(self.backend, 1)
        form.addRow("Device", row)
        form.addRow(self.trust_remote_code)
        form.addRow(self.load_button)
        form.addRow(self.loaded)
        self.recent: list[str] = []
        self.show_spec(PairSpec().resolved())
        if model is not None:
            model.pair_changed.connect(self._on_pair_changed)

    def field_widgets(self) -> dict[str, QWidget]:
        """The widget of each field a load failure can blame."""
        return {
            "target": self.target.combo,
            "draft": self.draft.combo,
            "device": self.device,
            "dtype": self.dtype,
            "backend": self.backend,
        }

    def _on_pair_changed(self) -> None:
        model = self._model
        failure = model.load_failure
        for name, widget in self.field_widgets().items():
            wrong = failure is not None and failure.field == name
            widget.setStyleSheet(WRONG_FIELD_STYLE if wrong else "")
            widget.setToolTip(failure.message if wrong else "")
        if failure is not None:
            resident = f" Still loaded: {model.pair.description}." if model.pair else ""
            self.loaded.setText(f"<b style='color:#c62828'>Load failed</b>: {escape(failure.message)}{resident}")
            self.loaded.setStyleSheet("")
        else:
            self.remember(model.spec.target, model.spec.draft)
            self.loaded.setText(f"Loaded: {escape(model.pair.description)}")
            self.loaded.setStyleSheet("color: #555;")
            # how the loaded draft's vocabulary relates to the target's, where the drafter is chosen
            # or which of the target's layers draft, and what each count measured
            vocabulary = model.pair.vocabulary
            tip = f"Loaded draft: {vocabulary}" if vocabulary else DEFAULT_DRAFTER_TIP
            self.drafter.setToolTip(model.pair.layers or tip)

    @property
    def drafter_kind(self) -> DrafterKind:
        return DRAFTER_KINDS[self.drafter.currentIndex()]

    def _on_drafter_changed(self, index: int) -> None:
        kind = DRAFTER_KINDS[index]
        self.draft.setEnabled(kind.needs_model)
        self._show_layers(kind is DrafterKind.LAYER_SKIP)
        if kind.needs_model and self.draft.value in BUILTIN_DRAFTS:
            self.draft.set_value(kind.builtin_model(DEFAULT_TARGET))  # the built-in one that goes with the kind

    def _show_layers(self, shown: bool) -> None:
        """The layer count beside the draft field only for layer skip, which reads no draft model:
        for the others the field keeps its width for a model's name."""
        self.draft_layers.setEnabled(shown)
        self.draft_layers.setVisible(shown)
        self._layers_label.setVisible(shown)

    def _on_drafter_picked(self, index: int) -> None:
        self._drafter_picked = True

    def spec(self) -> PairSpec:
        """The pair the panel names. Where the target's default drafter depends on what runs it
        (`engine.pair.default_drafter`), that default left as it opened is no choice: the pair
        names no drafter, and the loaded target's backend picks it."""
        kind: DrafterKind | None = self.drafter_kind
        draft = (self.draft.value or None) if self.drafter_kind.needs_model else None
        default = PairSpec(self.target.value)
        varies = default.resolved() != default.resolved("llama.cpp")
        if (
            varies
            and not self._drafter_picked
            and (kind, draft) == (default.resolved().drafter, default.resolved().draft)
        ):
            kind, draft = None, None
        return PairSpec(
            self.target.value,
            draft,
            kind,
            self.device.currentText(),
            self.dtype.currentText(),
            self.trust_remote_code.isChecked(),
            backend=self.backend.currentText(),
            target_model=self.served_model.text(),
            draft_layers=(self.draft_layers.value() or None) if kind is DrafterKind.LAYER_SKIP else None,
        )

    def show_spec(self, spec: PairSpec) -> None:
        """Show a resolved `spec` (one whose drafter is chosen)."""
        self.target.set_value(spec.target)
        self.served_model.setText(spec.target_model)
        self.drafter.setCurrentIndex(DRAFTER_KINDS.index(spec.drafter))
        self.draft.set_value(spec.draft or "")
        self.device.setCurrentText(spec.device)
        self.dtype.setCurrentText(spec.dtype)
        self.backend.setCurrentText(spec.backend)
        self.trust_remote_code.setChecked(spec.trust_remote_code)
        self.draft.setEnabled(spec.drafter.needs_model)
        self.draft_layers.setValue(spec.draft_layers or 0)
        self._show_layers(spec.drafter is DrafterKind.LAYER_SKIP)

    def remember(self, *names: str | None) -> None:
        for name in names:
            if name and name not in BUILTIN_MODELS:
                self.recent = [name] + [r for r in self.recent if r != name]
        self.recent = self.recent[:RECENT_LIMIT]
        self.target.set_recent(self.recent)
        self.draft.set_recent(self.recent)

    def save(self, settings: QSettings) -> None:
        settings.setValue("models/target", self.target.value)
        settings.setValue("models/served_model", self.served_model.text())
        settings.setValue("models/draft", self.draft.value)
        settings.setValue("models/drafter", self.drafter.currentText())
        settings.setValue("models/draft_layers", self.draft_layers.value())
        settings.setValue("models/device", self.device.currentText())
        settings.setValue("models/dtype", self.dtype.currentText())
        settings.setValue("models/backend", self.backend.currentText())
        settings.setValue("models/recent", self.recent)

    def restore(self, settings: QSettings) -> None:
        recent = settings.value("models/recent", [])
        self.recent = [recent] if isinstance(recent, str) else list(recent or [])
        self.remember()
        default = PairSpec().resolved()
        self.target.set_value(str(settings.value("models/target", default.target)))
        self.served_model.setText(str(settings.value("models/served_model", "")))
        self.draft.set_value(str(settings.value("models/draft", default.draft)))
        self.drafter.setCurrentText(str(settings.value("models/drafter", default.drafter.label)))
        self.draft_layers.setValue(int(settings.value("models/draft_layers", 0) or 0))
        self.device.setCurrentText(str(settings.value("models/device", default.device)))
        self.dtype.setCurrentText(str(settings.value("models/dtype", default.dtype)))
        self.backend.setCurrentText(str(settings.value("models/backend", default.backend)))


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
