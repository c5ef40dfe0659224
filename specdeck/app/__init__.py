"""SpecDeck's window: the Qt layer over the engine (PySide6, pyqtgraph, qasync).

PySide6 is imported here, before any module imports pyqtgraph, so that pyqtgraph binds to it.
"""

import PySide6.QtCore  # noqa: F401
