"""Where SpecDeck's bundled files are: prompt presets, icons, the shipped draft model, samples.

In a checkout they are the top-level `resources/` folder; in an installed wheel or a bundle the
same tree is installed as the `specdeck.resources` package.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def resource_path(*parts: str) -> Path:
    spec = importlib.util.find_spec("specdeck.resources")
    if spec is not None and spec.submodule_search_locations:
        root = Path(next(iter(spec.submodule_search_locations)))
    else:
        root = Path(__file__).resolve().parent.parent / "resources"
    return root.joinpath(*parts)
