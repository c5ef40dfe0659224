"""Loading a target/drafter pair and running one session on it: what the terminal, the window and
the benchmark share, so that all three decode the same way."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from specdeck.engine.config import DecodeConfig
from specdeck.engine.drafting.registry import load_drafter
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.events import Event
from specdeck.engine.forward.lean_weights import weights_of
from specdeck.engine.forward.llama_families import supports
from specdeck.engine.forward.llamacpp_backend import LlamaCppModel
from specdeck.engine.loading.models import LoadedModel, Progress, encode_prompt, load_model, load_tokenizer
from specdeck.engine.loop.decoding import generate
from specdeck.engine.memory import trim_heap
from specdeck.engine.pair import ModelPair, PairSpec, load_options, remote_settings
from specdeck.engine.remote.remote_http import redact_url
from specdeck.engine.remote.remote_target import RemoteTarget, connect

DEFAULT_PROMPT = (
    "Summarize in two sentences: Speculative decoding speeds up a large language model by letting a "
    "small draft model propose several tokens that the large model then checks in a single forward pass. "
    "Tokens the large model agrees with are kept, so the output is exactly what the large model alone "
    "would have written."
)


def load_pair(spec: PairSpec, plain: bool = False, progress: Progress | None = None) -> ModelPair:
    """Load the target and, unless `plain`, the drafter `spec.resolved()` chooses (a hybrid's model:
    the feature head or draft model its draft names), and compare a draft model's vocabulary with the
    target's (`ModelPair.vocabulary`): one with a tokenizer of its own drafts across them. Where the
    drafter is left to its default and SpecDeck's own do not attach to the target, `progress` and
    the pair's `note` say why in one line; where a served target's rounds cannot promise a speed-up
    (`RemoteTarget.note`), they say that too."""
    chosen = spec.resolved()  # checked before anything loads
    target_model = _load_target(chosen, progress)
    if plain:
        return _attach_drafter(target_model, chosen.with_drafter(None, None), progress)
    backend = _backend(target_model)
    pair = _attach_drafter(target_model, spec.resolved(backend), progress)
    pair.note = spec.default_note(backend) or ""
    if progress and pair.note:
        progress(pair.note)
    if isinstance(target_model, RemoteTarget) and target_model.note:  # said as it connected
        pair.note = " ".join(note for note in (pair.note, target_model.note) if note)
    return pair


def load_pairs(specs: Sequence[PairSpec], progress: Progress | None = None) -> list[ModelPair]:
    """One pair per spec, all sharing one loaded target (the specs differ in their drafter only);
    every spec is resolved and checked before anything loads."""
    chosen = _resolve_all(specs)
    target_model = _load_target(chosen[0], progress)
    return [_attach_drafter(target_model, spec, progress) for spec in _resolve_all(specs, _backend(target_model))]


def add_drafters(pair: ModelPair, specs: Sequence[PairSpec], progress: Progress | None = None) -> list[ModelPair]:
    """More pairs on `pair`'s loaded target (the one `specs` name), one per spec, resolved and
    loaded as `load_pairs` does; the target is not loaded again."""
    return [_attach_drafter(pair.target, spec, progress) for spec in _resolve_all(specs, _backend(pair.target))]


def _load_target(spec: PairSpec, progress: Progress | None) -> LoadedModel | RemoteTarget:
    """The target model, loaded; or, for a server's address, the served target, read with the
    tokenizer `PairSpec.remote_tokenizer` names."""
    if not spec.remote:
        target = load_model(spec.target, load_options(spec), progress)
        _lay_out_weights(target, progress)
        trim_heap()  # what the load freed since the layout (40 MB after a 1.7B GGUF file): a session's peak sits on it
        return target
    if progress:
        progress(f"Connecting to {redact_url(spec.target)}")
    served = connect(remote_settings(spec), load_tokenizer(spec.remote_tokenizer, progress))
    if progress and served.note:  # how its rounds are verified, where that promises no speed-up
        progress(served.note)
    return served


def _lay_out_weights(target: LoadedModel, progress: Progress | None) -> None:
    """Lay out the target's weights for the lean forward (packed for this machine's products, a GGUF
    file's blocks found) now, while the load reports progress, rather than silently at the first
    session, which would otherwise wait seconds for its first token."""
    if isinstance(target.model, LlamaCppModel) or not supports(target.model):
        return
    if progress:
        progress(f"Laying out {target.name}'s weights for this machine's products")
    weights_of(target.model)


def _backend(target: LoadedModel | RemoteTarget) -> str | None:
    """What runs a loaded target ("torch", "llama.cpp"); None for a served one."""
    if not isinstance(target, LoadedModel):
        return None
    return LlamaCppModel.backend if isinstance(target.model, LlamaCppModel) else "torch"


def _resolve_all(specs: Sequence[PairSpec], backend: str | None = None) -> list[PairSpec]:
    """The specs resolved (`PairSpec.resolved`, for a target run by `backend`), each drafter named once."""
    chosen = [spec.resolved(backend) for spec in specs]
    if len({spec.with_drafter(None, None) for spec in chosen}) > 1:
        raise SpecDeckError("Drafters timed together share one target: give them the same target, device and dtype.")
    repeated = [spec.drafter_entry for spec in chosen if chosen.count(spec) > 1]
    if repeated:
        raise SpecDeckError(f"The drafter {repeated[0]} is named twice: name each drafter once.")
    return chosen


def _attach_drafter(target_model: LoadedModel | RemoteTarget, spec: PairSpec, progress: Progress | None) -> ModelPair:
    """The pair of the loaded target and the resolved `spec`'s drafter (None: plain only), with
    what its kind drafts with loaded beside the target (`load_drafter`), or refused where the
    kind does not run on the target's path."""
    if spec.drafter is None:
        return ModelPair(target_model)
    models = load_drafter(spec.drafter, target_model, spec.draft, spec.draft_layers, load_options(spec), progress)
    return ModelPair(
        target_model,
        models.draft,
        spec.drafter,
        models.head,
        vocabulary=models.vocabulary,
        layer_choice=models.layer_choice,
    )


def run_session(
    pair: ModelPair,
    prompt: str,
    config: DecodeConfig,
    chat: bool = True,
    plain: bool = False,
    cancel: threading.Event | None = None,
) -> Iterator[Event]:
    """Encode the prompt and decode: speculatively with the pair's drafter, or plainly."""
    prompt_ids = encode_prompt(pair.target.tokenizer, prompt, chat)
    drafter = None if plain else pair.make_drafter()
    return generate(pair.target, prompt_ids, config, drafter, cancel)
