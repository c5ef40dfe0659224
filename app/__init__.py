"""SpecDeck's window: the Qt layer over the engine (PySide6, pyqtgraph, qasync)."""
