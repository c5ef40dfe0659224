"""Where SpecDeck's bundled files are: prompt presets, icons, the shipped draft model, samples.

They are the `specdeck.resources` package, in a checkout, an installed wheel and a bundle alike.
"""

from __future__ import annotations

from pathlib import Path

import specdeck.resources


def resource_path(*parts: str) -> Path:
    return Path(specdeck.resources.__file__).parent.joinpath(*parts)
