"""The model panel (`ModelPanel`): which pair of models to load, the target and draft each picked
from built-in aliases, recently used models or a browsed folder or file (`ModelPicker`).

Given the `SessionModel`, it shows the resident pair or why the last load failed. It reads and
writes its values through QSettings so that a launch starts where the last ended, as the decoding
panel (`panels`) does.
"""

from __future__ import annotations

from html import escape

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMenu,
    QPushButton,
    QSpinBox,
    QToolButton,
    QWidget,
)

from specdeck.app.session_model import SessionModel
from specdeck.engine.loading.registry import BACKENDS, BUILTIN_MODELS, DEFAULT_TARGET, LAST_STATE_HEAD
from specdeck.engine.pair_spec import DrafterKind, PairSpec
from specdeck.engine.remote.remote_http import API_KEY_VARIABLE

DRAFTER_KINDS = tuple(DrafterKind)  # in the drafter combo's order
DEFAULT_DRAFTER_TIP = (
    "Left as it opens, the built-in target's drafter (also for its model in a file of your own) follows "
    "what runs it: its feature head on torch, the suffix drafter on llama.cpp, where a verify costs "
    "about a step per token and only long copies pay; another target gets prompt lookup"
)
BUILTIN_DRAFTS = {kind.builtin_model(DEFAULT_TARGET) for kind in DrafterKind} - {None} | {LAST_STATE_HEAD}
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "bfloat16", "float16")
RECENT_LIMIT = 10
WRONG_FIELD_STYLE = "border: 2px solid #c62828;"


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
        self._show_layers(self.drafter_kind.takes_layers)
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
        for name, widget in self.field_widgets().items():  # an edit of the field blamed is its fix
            widget.currentTextChanged.connect(lambda _text, name=name: self._on_field_edited(name))

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
            line = model.pair.note or self._swapped_drafter(model.pair)
            note = f"<br>{escape(line)}" if line else ""
            self.loaded.setText(f"Loaded: {escape(model.pair.description)}{note}")
            self.loaded.setStyleSheet("color: #555;")
            # how the loaded draft's vocabulary relates to the target's, where the drafter is chosen
            # or which of the target's layers draft, and what each count measured
            vocabulary = model.pair.vocabulary
            tip = f"Loaded draft: {vocabulary}" if vocabulary else DEFAULT_DRAFTER_TIP
            self.drafter.setToolTip(model.pair.layers or tip)

    def _swapped_drafter(self, pair) -> str:
        """Where the drafter that loaded is not the one the panel shows (left to its default, it
        follows what runs the target), the line that says so; else ""."""
        if not pair.drafter or pair.drafter == self.drafter_kind.value:
            return ""
        return (
            f"{DrafterKind(pair.drafter).label} drafts, not the {self.drafter_kind.label} shown: left to "
            f"its default, the drafter follows what runs the target ({pair.backend})."
        )

    def _on_field_edited(self, name: str) -> None:
        """The outline of a failed load comes off the field it blamed once that field is changed."""
        widget = self.field_widgets()[name]
        if widget.styleSheet():
            widget.setStyleSheet("")
            widget.setToolTip("")

    @property
    def drafter_kind(self) -> DrafterKind:
        return DRAFTER_KINDS[self.drafter.currentIndex()]

    def _on_drafter_changed(self, index: int) -> None:
        kind = DRAFTER_KINDS[index]
        self.draft.setEnabled(kind.needs_model)
        self._show_layers(kind.takes_layers)
        if kind.needs_model and self.draft.value in BUILTIN_DRAFTS:
            self.draft.set_value(kind.builtin_model(DEFAULT_TARGET))  # the built-in one that goes with the kind

    def _show_layers(self, shown: bool) -> None:
        """The layer count beside the draft field only for a kind that takes one (layer skip), which
        reads no draft model: for the others the field keeps its width for a model's name."""
        self.draft_layers.setEnabled(shown)
        self.draft_layers.setVisible(shown)
        self._layers_label.setVisible(shown)

    def _on_drafter_picked(self, index: int) -> None:
        self._drafter_picked = True

    def spec(self) -> PairSpec:
        """The pair the panel names. A drafter the user did not pick is no choice where it is the
        target's default and that depends on what runs it (`specdeck.engine.pair.default_drafter`), or where
        it is the built-in target's pair the panel opens with and the target is another model: the
        pair names no drafter, and the loaded target picks it (and says why, `ModelPair.note`)."""
        kind: DrafterKind | None = self.drafter_kind
        draft = (self.draft.value or None) if self.drafter_kind.needs_model else None
        default, opened = PairSpec(self.target.value).resolved(), PairSpec().resolved()
        varies = default != PairSpec(self.target.value).resolved("llama.cpp")
        shown = (kind, draft)
        if not self._drafter_picked and (
            (varies and shown == (default.drafter, default.draft))
            or (default.drafter != opened.drafter and shown == (opened.drafter, opened.draft))
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
            draft_layers=(self.draft_layers.value() or None) if kind is not None and kind.takes_layers else None,
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
        self._show_layers(spec.drafter.takes_layers)

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
