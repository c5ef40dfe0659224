"""How each token state looks: the character formats the token view and its legend draw with, and
the state read back from a drawn format (what the tests check).

Each state has a look that survives without colour (a second cue beside the colour), and the
colours come in two palettes, the second safe for colour-blind eyes (Okabe and Ito):

- accepted drafts: a tinted background;
- rejected drafts: struck through on a tinted background, where they were proposed (before the
  target's replacement);
- discarded drafts (after a rejected one in the same round, or a sampled tree's alternatives left
  untried; never judged): grey, italic, struck through;
- resampled tokens (the target's replacement): a wavy underline;
- bonus tokens (every draft passed): bold;
- plain tokens: as they are;
- drafts that prompt lookup copied from earlier text: dotted underneath, so the drafter's own
  guesses stay apart from the copies.
"""

from __future__ import annotations

from PySide6.QtGui import QColor, QFont, QTextCharFormat, QTextDocument

from specdeck.engine.events import TokenState

REFUSED = (TokenState.REJECTED, TokenState.DISCARDED)

PALETTES = {
    "standard": {
        TokenState.ACCEPTED: "#1b8a2f",
        TokenState.REJECTED: "#c62828",
        TokenState.DISCARDED: "#8a8a8a",
        TokenState.RESAMPLED: "#e07000",
        TokenState.BONUS: "#1f5fd1",
    },
    # Okabe and Ito's palette: told apart under protanopia, deuteranopia and tritanopia
    "colour-blind safe": {
        TokenState.ACCEPTED: "#0072b2",
        TokenState.REJECTED: "#d55e00",
        TokenState.DISCARDED: "#8a8a8a",
        TokenState.RESAMPLED: "#cc79a7",
        TokenState.BONUS: "#009e73",
    },
}


def token_format(state: TokenState, copied: bool = False, palette: str = "standard") -> QTextCharFormat:
    """The look of a token: its state's colour and its state's second cue (see the module's
    docstring); a copy by prompt lookup dotted underneath."""
    fmt = QTextCharFormat()
    colours = PALETTES[palette]
    if state in colours:
        fmt.setForeground(QColor(colours[state]))
    if state in (TokenState.ACCEPTED, TokenState.REJECTED):
        background = QColor(colours[state])
        background.setAlpha(40 if state is TokenState.ACCEPTED else 28)
        fmt.setBackground(background)
    if state in REFUSED:
        fmt.setFontStrikeOut(True)
    if state is TokenState.DISCARDED:
        fmt.setFontItalic(True)
    if state is TokenState.RESAMPLED:
        fmt.setUnderlineStyle(QTextCharFormat.UnderlineStyle.WaveUnderline)
        fmt.setUnderlineColor(QColor(colours[state]))
    if state is TokenState.BONUS:
        fmt.setFontWeight(QFont.Weight.Bold)
    if copied:
        fmt.setUnderlineStyle(QTextCharFormat.UnderlineStyle.DotLine)
    return fmt


def state_of(fmt: QTextCharFormat) -> TokenState | None:
    """The state a character format draws, read from its cues other than colour (None: plain text)."""
    if fmt.fontStrikeOut():
        return TokenState.DISCARDED if fmt.fontItalic() else TokenState.REJECTED
    if fmt.underlineStyle() == QTextCharFormat.UnderlineStyle.WaveUnderline:
        return TokenState.RESAMPLED
    if fmt.fontWeight() >= QFont.Weight.Bold:
        return TokenState.BONUS
    if fmt.hasProperty(QTextCharFormat.Property.BackgroundBrush):
        return TokenState.ACCEPTED
    return None


def document_formats(document: QTextDocument) -> list[tuple[str, QTextCharFormat]]:
    """(text, format) for each run of characters of one format, as drawn; "\n" between blocks."""
    runs: list[tuple[str, QTextCharFormat]] = []
    block = document.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            runs.append((fragment.text(), fragment.charFormat()))
            it += 1
        block = block.next()
        if block.isValid():
            runs.append(("\n", QTextCharFormat()))
    return runs
