"""Session statistics to files: one CSV row per round, a JSON file of what produced them
(models, device, dtype, parameters, seed, library versions, summary figures) and, optionally, one
CSV row per token. Shared by the window and the benchmark.

Counts and token ids are in the target's tokenizer; the `draft_tokens` and `draft_q` columns hold
what a draft with a tokenizer of its own wrote, in its tokenizer (`TOKENIZERS` says so in the JSON).

Every write goes through `specdeck.engine.atomic`: a failed or interrupted export never leaves a
half-written file.
"""

from __future__ import annotations

import csv
import io
import json
import os
import platform
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

from specdeck.engine.atomic import write_text
from specdeck.engine.config import DecodeConfig
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.events import RoundEvent, SummaryEvent, TokenEvent, event_to_dict

ROUND_COLUMNS = (
    "session",
    "mode",
    "round",
    "drafted",
    "accepted",
    "discarded",
    "draft_ms",
    "verify_ms",
    "tokens_so_far",
    "elapsed_s",
    "copied",
    "match_length",
    "shape",
    "draft_tokens",
    "network_ms",
    "server_ms",
    "server_cache_hit",
    "recomputed_tokens",
)
# network_ms, server_ms, server_cache_hit, recomputed_tokens: a remote target's split of verify_ms and
# the prompt tokens its server computed (`RoundEvent`); blank for a local target, and all but
# network_ms also where the server does not report them
# pos: where a kept token stands or a draft was proposed; acceptance_probability: min(1, p/q), only
# for drafts the rule judged (accepted, rejected), blank for discarded drafts and the target's tokens
TOKEN_COLUMNS = (
    "session",
    "mode",
    "round",
    "pos",
    "depth",
    "state",
    "token_id",
    "text",
    "p",
    "q",
    "acceptance_probability",
    "copied",
    "source",
    "draft_tokens",
    "draft_q",
)
TOKENIZERS = {
    "target": "drafted, accepted, discarded, tokens_so_far, match_length, token_id, text, p and q: the target's tokens",
    "draft": "draft_tokens (per round a count, per token the draft's own tokens as a JSON list) and draft_q: "
    "the tokens of a draft with a tokenizer of its own, blank when it shares the target's",
}


@dataclass
class SessionRecord:
    """Everything one session streamed, kept for export."""

    session: int
    mode: str  # "speculative" or "plain"
    rounds: list[RoundEvent] = field(default_factory=list)
    tokens: list[TokenEvent] = field(default_factory=list)
    summary: SummaryEvent | None = None

    def add(self, event) -> None:
        if isinstance(event, RoundEvent):
            self.rounds.append(event)
        elif isinstance(event, TokenEvent):
            self.tokens.append(event)
        elif isinstance(event, SummaryEvent):
            self.summary = event


@dataclass
class RunInfo:
    """What produced the sessions: the pair, where it ran, and the settings."""

    target: str
    draft: str | None
    drafter: str | None
    device: str
    dtype: str
    config: DecodeConfig
    chat: bool
    prompt: str
    extra_versions: dict[str, str] = field(default_factory=dict)
    vocabulary: str = ""  # the pair's vocabulary case (`specdeck.engine.drafting.vocabulary.VocabularyMatch.describe`)
    # what ran the target, in words: "Q4_1 blocks on the row kernel (8-bit rows)", "float32", "llama.cpp Q4_1"
    backend: str = "float32"  # (`LoadedModel.runs`)


def library_versions() -> dict[str, str]:
    import torch
    import transformers

    try:
        specdeck = metadata.version("specdeck")
    except metadata.PackageNotFoundError:
        specdeck = "unknown"
    return {
        "specdeck": specdeck,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def _backend_version(backend: str) -> dict[str, str]:
    """llama-cpp-python's version where it ran the target (it fixes the arithmetic, so the figures)."""
    if not backend.startswith("llama.cpp"):
        return {}
    try:
        return {"llama-cpp-python": metadata.version("llama_cpp_python")}
    except metadata.PackageNotFoundError:
        return {}


def rounds_csv(records: list[SessionRecord]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")  # RFC 4180: a field holding a lone \r is quoted too
    writer.writerow(ROUND_COLUMNS)
    for record in records:
        for r in record.rounds:
            writer.writerow(
                (
                    record.session,
                    record.mode,
                    r.round,
                    r.drafted,
                    r.accepted,
                    r.discarded,
                    f"{r.draft_ms:.3f}",
                    f"{r.verify_ms:.3f}",
                    r.new_tokens,
                    f"{r.elapsed_s:.6f}",
                    str(r.copied).lower(),
                    r.match_length,
                    r.shape,
                    "" if r.draft_tokens is None else r.draft_tokens,
                    _optional_ms(r.network_ms),
                    _optional_ms(r.server_ms),
                    "" if r.server_cache_hit is None else str(r.server_cache_hit).lower(),
                    "" if r.recomputed_tokens is None else r.recomputed_tokens,
                )
            )
    return out.getvalue()


def _optional_ms(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def tokens_csv(records: list[SessionRecord]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")  # RFC 4180: a field holding a lone \r is quoted too
    writer.writerow(TOKEN_COLUMNS)
    for record in records:
        for t in record.tokens:
            a = t.acceptance_probability
            writer.writerow(
                (
                    record.session,
                    record.mode,
                    t.round,
                    t.pos,
                    t.depth,
                    t.state.value,
                    t.token_id,
                    t.text,
                    f"{t.p:.6g}",
                    "" if t.q is None else f"{t.q:.6g}",
                    "" if a is None else f"{a:.6g}",
                    str(t.copied).lower(),
                    t.source,
                    _json_list(t.draft_tokens),
                    _json_list(t.draft_q),
                )
            )
    return out.getvalue()


def _json_list(values: tuple) -> str:
    return json.dumps(list(values), ensure_ascii=False) if values else ""


def metadata_json(info: RunInfo, records: list[SessionRecord]) -> str:
    sessions = []
    for record in records:
        summary = event_to_dict(record.summary) if record.summary else None
        sessions.append({"session": record.session, "mode": record.mode, "summary": summary})
    speedup = None
    by_mode = {r.mode: r.summary for r in records if r.summary}
    if "speculative" in by_mode and "plain" in by_mode and by_mode["plain"].tokens_per_s > 0:
        speedup = by_mode["speculative"].tokens_per_s / by_mode["plain"].tokens_per_s
    document = {
        "models": {"target": info.target, "draft": info.draft, "drafter": info.drafter, "vocabulary": info.vocabulary},
        "tokenizers": TOKENIZERS,
        "device": info.device,
        "dtype": info.dtype,
        "backend": info.backend,
        "parameters": {**asdict(info.config), "chat": info.chat},
        "seed": info.config.seed,
        "prompt": info.prompt,
        "versions": {**library_versions(), **_backend_version(info.backend), **info.extra_versions},
        "measured_speedup": speedup,
        "sessions": sessions,
    }
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def export_paths(csv_path: str | os.PathLike) -> tuple[Path, Path, Path]:
    """The round CSV, its metadata JSON and the per-token CSV, side by side."""
    path = Path(csv_path)
    stem = path.with_suffix("") if path.suffix.lower() == ".csv" else path
    return path, stem.with_name(stem.name + ".meta.json"), stem.with_name(stem.name + ".tokens.csv")


def _written_by_an_export(path: Path, beginning: str) -> bool:
    """Whether the file at `path` begins as SpecDeck's export of its kind does (`beginning`)."""
    try:
        with path.open("rb") as file:
            return file.read(len(beginning.encode())).decode("utf-8", "replace") == beginning
    except OSError:
        return False


def export_sessions(
    csv_path: str | os.PathLike, info: RunInfo, records: list[SessionRecord], per_token: bool = False
) -> list[Path]:
    """Write the round CSV and its metadata (and the token CSV when asked); return the paths written.
    The files beside the one chosen replace only earlier exports (the choice confirmed the CSV alone)."""
    rounds_path, meta_path, tokens_path = export_paths(csv_path)
    beside = [(meta_path, '{\n  "models": ')] + ([(tokens_path, ",".join(TOKEN_COLUMNS))] if per_token else [])
    for path, beginning in beside:
        if path.exists() and not _written_by_an_export(path, beginning):
            raise SpecDeckError(
                f"{path} exists and is no export of SpecDeck's: it would be replaced. Choose another name, or move it."
            )
    write_text(rounds_path, rounds_csv(records))
    write_text(meta_path, metadata_json(info, records))
    written = [rounds_path, meta_path]
    if per_token:
        write_text(tokens_path, tokens_csv(records))
        written.append(tokens_path)
    return written
