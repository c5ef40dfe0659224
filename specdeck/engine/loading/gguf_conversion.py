"""A GGUF file dequantized once into a Hugging Face folder in SpecDeck's cache, which torch loads
(`specdeck.engine.loading.models.locate`), and the record that tells a damaged folder from a whole one.

The folder is a standard one (a tied output layer saved once under the embedding's name, as
transformers saves a model), so that other tools, a vLLM server say, load the same weights. Its
name carries the file's path, size and time of change, the transformers version and the folder's
format (`CONVERSION_FORMAT`): a change to any of them converts again. `model.safetensors` gets its
size and SHA-256 beside it (`WEIGHTS_RECORD_FILE`), checked at every load: the size at once, the
checksum on a thread of its own while the load reads the weights (`pending_damage` waits for it).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from specdeck.engine.atomic import building_folder
from specdeck.engine.cache import gguf_cache, heal
from specdeck.engine.errors import SpecDeckError, unreadable_gguf
from specdeck.engine.loading.gguf_checks import check_gguf

Progress = Callable[[str], None]

CONVERSION_FORMAT = 2  # of a converted folder: 2 saves tied weights as transformers does (servers read them)


def conversion_folder(path: Path) -> Path:
    import transformers

    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}|{CONVERSION_FORMAT}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return gguf_cache() / f"{path.stem}-{digest}"


def convert_gguf(path: Path, progress: Progress | None = None, beside_load: bool = False) -> Path:
    """Dequantize a GGUF file once into a Hugging Face folder in the cache; return the folder.
    A folder converted before is checked against its record: at once, or with `beside_load` (a
    caller that loads the weights and then calls `pending_damage`) on a thread meanwhile."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_gguf(path)  # its metadata must imply exactly its tensors, before any of it is converted
    target = conversion_folder(path)
    heal(progress)
    if (target / "model.safetensors").exists():
        damage = cache_damage(target, checksum=not beside_load)
        if damage is None:
            if beside_load:
                _check_beside_the_load(target)
            return target
        if progress:
            progress(f"The cached conversion of {path.name} in {target} is damaged ({damage}): converting it again")
        shutil.rmtree(target, ignore_errors=True)
    elif progress:
        progress(f"Converting {path.name} to safetensors (once; later loads are fast)")
    _check_room(path, target)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as error:  # the gguf reader raises many types on a damaged file
        raise unreadable_gguf(path, error) from error
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config  # the weights are dequantized now
    # as transformers saves a model, so that other tools (a vLLM server) load the folder too: a tied
    # output layer is the embedding, saved once under the embedding's name
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    tensors = {name: tensor.contiguous() for name, tensor in state.items()}
    try:  # any failure, Ctrl-C included, removes what it began; a killed process's entry is healed later
        with building_folder(target, replace_unmarked=True) as staging:  # an entry of the cache's own
            model.config.save_pretrained(staging)
            model.generation_config.save_pretrained(staging)
            try:
                save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
            except SafetensorError as error:  # safetensors' own error for a failed write (a full disk, say)
                raise SpecDeckError(
                    f"Cannot write the converted weights of {path.name} to {target}: {error}."
                ) from error
            record_weights(staging)
            tokenizer.save_pretrained(staging)
    except SpecDeckError:
        if not (target / "model.safetensors").exists():  # unless another process finished it meanwhile
            raise
    return target


def _check_room(path: Path, target: Path) -> None:
    """Refuse a conversion whose float32 weights (the file's tensors' sizes, read from its index)
    the cache's disk has no room for, before any work, saying what to free or where else to point
    the cache. A file whose index does not read is left to the conversion to name."""
    from specdeck.engine.forward.gguf_index import tensors_of

    try:
        size = 4 * sum(math.prod(t.shape) for t in tensors_of(path).values())
    except Exception:  # gguf's reader raises many types on a damaged file
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(target.parent).free
    if size + (64 << 20) > free:  # and a little for the tokenizer and the config
        raise SpecDeckError(
            f"Converting {path.name} needs about {size / 1e6:,.0f} MB in {target.parent}, which has "
            f"{free / 1e6:,.0f} MB free: free some space there, or point SPECDECK_CACHE at a disk with room."
        )


WEIGHTS_RECORD_FILE = "weights_record.json"  # {"size": bytes, "sha256": hex} of a cache's model.safetensors


def _weights_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def record_weights(folder: Path) -> None:
    """Write the size and SHA-256 of `folder`'s model.safetensors beside it (`WEIGHTS_RECORD_FILE`)."""
    weights = folder / "model.safetensors"
    record = {"size": weights.stat().st_size, "sha256": _weights_digest(weights)}
    (folder / WEIGHTS_RECORD_FILE).write_text(json.dumps(record), encoding="utf-8")


_CHECKS: dict[Path, tuple[threading.Thread, list[str | None]]] = {}


def _check_beside_the_load(folder: Path) -> None:
    """Start comparing the folder's weights with their recorded checksum on a thread (hashing
    releases the GIL: it takes the other core while the load reads the same bytes)."""
    verdict: list[str | None] = []
    thread = threading.Thread(
        target=lambda: verdict.append(_checksum_damage(folder)), name="weights checksum", daemon=True
    )
    _CHECKS[folder] = (thread, verdict)
    thread.start()


def pending_damage(folder: Path) -> str | None:
    """The verdict of the checksum `convert_gguf` started on `folder` (waited for), or None where
    none was started or it matched."""
    thread, verdict = _CHECKS.pop(folder, (None, [None]))
    if thread is not None:
        thread.join()
    return verdict[0] if verdict else "its checksum could not be computed"


def cache_damage(folder: Path, checksum: bool = True) -> str | None:
    """What is wrong with a converted cache's weights, or None when they match their record (about
    half a second for SmolLM2-135M's 540 MB; with `checksum` False their size only). A cache from
    before records were kept is recorded now if safetensors can read its header and sizes, and
    reported damaged if not."""
    weights = folder / "model.safetensors"
    try:
        record = json.loads((folder / WEIGHTS_RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict):
        return _legacy_cache_damage(folder)
    size = weights.stat().st_size
    if size != record.get("size"):
        return f"model.safetensors is {size} bytes, {record.get('size')} were written"
    return _checksum_damage(folder) if checksum else None


def _checksum_damage(folder: Path) -> str | None:
    try:
        record = json.loads((folder / WEIGHTS_RECORD_FILE).read_text(encoding="utf-8"))
        if _weights_digest(folder / "model.safetensors") == record.get("sha256"):
            return None
    except (OSError, ValueError, AttributeError) as error:
        return f"model.safetensors cannot be checked ({error})"
    return "the checksum of model.safetensors differs from the one recorded when it was written"


def converted_weights(folder: Path) -> tuple[str, Path] | None:
    """The recorded SHA-256 of a converted folder's weights and the folder, or None for a folder
    that is not a conversion with a record."""
    try:
        digest = json.loads((folder / WEIGHTS_RECORD_FILE).read_text(encoding="utf-8"))["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (digest, folder) if isinstance(digest, str) else None


def _legacy_cache_damage(folder: Path) -> str | None:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(folder / "model.safetensors"), "pt"):
            pass
    except (SafetensorError, OSError) as error:
        return f"model.safetensors cannot be read: {error}"
    record_weights(folder)
    return None
