"""What a benchmark sweeps, written as text: K ('auto,1,2,4'), prompt-lookup lengths ('0,2') and
drafters ('draft-model,feature-head:path/to/head'). The command line and the window's Benchmark tab
read the same text the same way; the `format_*` functions write it back."""

from __future__ import annotations

from specdeck.bench.settings import AUTO_K
from specdeck.engine.drafting.kinds import DrafterKind
from specdeck.engine.errors import SpecDeckError


def parse_ks(text: str) -> tuple[int, ...]:
    """'4', 'auto' or a sweep 'auto,1,2,4' as draft lengths (`AUTO_K` for auto), in the order given,
    without repeats."""
    ks: list[int] = []
    for part in (part.strip().lower() for part in text.split(",")):
        if part == "auto":
            ks.append(AUTO_K)
        elif part:
            ks += _parse_sweep(
                part,
                1,
                "K takes whole numbers or auto, e.g. 4, auto or a sweep auto,1,2,4",
                "K takes positive draft lengths or auto, e.g. 4, auto or a sweep auto,1,2",
            )
    if not ks:
        raise SpecDeckError(f"K takes whole numbers or auto, e.g. 4, auto or a sweep auto,1,2,4 (got {text!r}).")
    return tuple(dict.fromkeys(ks))


def format_ks(ks: tuple[int, ...]) -> str:
    """Draft lengths as `parse_ks` reads them: 'auto,1,2'."""
    return ",".join(str(k) if k != AUTO_K else "auto" for k in ks)


def parse_lookups(text: str) -> tuple[int, ...]:
    """'2' or a sweep '0,2' as lookup lengths (0: off), in the order given, without repeats."""
    return _parse_sweep(
        text,
        0,
        "--lookup takes whole numbers, e.g. 2 or a sweep 0,2",
        "--lookup takes tokens to copy per round, 0 for off, e.g. 0,2",
    )


def format_lookups(lookups: tuple[int, ...]) -> str:
    """Lookup lengths as `parse_lookups` reads them: '0,2'."""
    return ",".join(map(str, lookups))


def _parse_sweep(text: str, lowest: int, not_numbers: str, too_small: str) -> tuple[int, ...]:
    """Comma-separated whole numbers of at least `lowest`, in order, without repeats; the messages
    say what is wrong otherwise."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as error:
        raise SpecDeckError(f"{not_numbers} (got {text!r}).") from error
    if not values or min(values) < lowest:
        raise SpecDeckError(f"{too_small} (got {text!r}).")
    return tuple(dict.fromkeys(values))


def parse_drafters(text: str, where: str = "--drafters") -> list[tuple[DrafterKind, str | None]]:
    """'draft-model,feature-head:path/to/head' as (drafter kind, model or None) entries, in order;
    `where` names the option in error messages. `PairSpec.drafter_entry` writes one entry."""
    entries = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        name, _, model = (piece.strip() for piece in entry.partition(":"))
        try:
            kind = DrafterKind.named(name, where)
        except SpecDeckError as error:
            raise SpecDeckError(f"{error} Each may come as kind:MODEL.") from None
        if kind.copies_text and model:
            raise SpecDeckError(
                f"The {kind.label} drafter needs no model: write {kind} alone in {where} (got {entry!r})."
            )
        entries.append((kind, model or None))
    if not entries:
        raise SpecDeckError(f"{where} names no drafter: e.g. draft-model,feature-head.")
    return entries
