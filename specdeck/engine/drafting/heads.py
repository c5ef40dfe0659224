"""A feature head: a drafter of one decoder layer (or a few) that reads the target's own last hidden
state (EAGLE, Li et al. 2024).

The target's last (normalised) hidden state f_i at position i already decides its next token
through the output layer. The head takes the pair (f_i, embedding of token i+1) and predicts
f_{i+1}, the state the target will have one token later; the target's own output layer turns the
prediction into the draft distribution. Drafting K tokens feeds each predicted state back in.
Everything vocabulary-sized (the embedding and the output layer) is the target's, so the head
itself is small (one decoder layer): for a target with a 49k vocabulary it is a few MB and far
cheaper per token than a separate draft model. A deeper head (`layers` in `head_config`) pays only
where its drafts pass more often by more than its extra layers cost a round.

A head may also read lower layers of the target (EAGLE-3, Li et al. 2025): with `feature_layers`
in its config, the target hands over, per token, the residual stream after each of those many
decoder layers beside the final state, and `fuse` (each normalised, then one linear map) turns
them into the head's input state. The states it predicts itself are fed back as they are.

On disk a head is a folder: `config.json` (a `LlamaConfig` of its layers, with `feature_layers` if it
fuses, plus `specdeck_head`, the target's hidden size and vocabulary width), `model.safetensors`,
and optionally `output_tokens.json`, the tokens the head may propose.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaModel, PreTrainedModel

from specdeck.engine.atomic import building_folder, record_path, recorded_damage, write_with
from specdeck.engine.bounded import read_json
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward.hf_parts import output_projection
from specdeck.engine.forward.lean_weights import output_rows
from specdeck.engine.forward.llamacpp_backend import LlamaCppModel, matrices_of
from specdeck.engine.loading.models import OUTPUT_TOKENS_FILE, LoadedModel, Progress, locate, read_output_tokens
from specdeck.engine.loading.registry import HEAD_KEY, is_head_folder


class FeatureHead(torch.nn.Module):
    """fc(f_i ++ e_{i+1}) -> Llama decoder layers (own KV cache) -> final norm -> predicted f_{i+1}."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        width = config.hidden_size
        self.feature_layers = tuple(getattr(config, "feature_layers", None) or ())
        if self.feature_layers:
            self.fuse_fc = torch.nn.Linear((len(self.feature_layers) + 1) * width, width, bias=False)
        self.fc = torch.nn.Linear(2 * width, width, bias=False)
        self.body = LlamaModel(config)  # its token embedding is unused (vocab_size 1): inputs are fc's output

    def fuse(self, observed: torch.Tensor, fc: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """The input state (..., hidden) for the target's states of a token: (..., hidden), its final
        state, for a head without `feature_layers`; else (..., len(feature_layers) + 1, hidden), the
        residual streams after those layers (each scaled to unit RMS: the middle layers' are a
        hundred times larger) and the final state, mixed by one linear map (through `fc` in place of
        its own where given: a drafter's product of the same matrix)."""
        if not self.feature_layers:
            return observed
        lower, final = observed[..., :-1, :], observed[..., -1, :]
        unit = lower * torch.rsqrt(lower.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(lower.dtype)
        return (self.fuse_fc if fc is None else fc)(torch.cat([unit.flatten(-2), final], dim=-1))

    def mix(
        self, features: torch.Tensor, embeddings: torch.Tensor, fc: Callable[[torch.Tensor], torch.Tensor] | None = None
    ) -> torch.Tensor:
        """The decoder layer's inputs (..., n, hidden) for n (state, next-token embedding) pairs;
        through `fc` in place of its own map where given (a drafter's product of the same matrix)."""
        return (self.fc if fc is None else fc)(torch.cat([features, embeddings], dim=-1))

    def forward(self, features: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        """Predicted next states (batch, n, hidden) for n pairs, all at once (training; drafting runs
        the same layers step by step over a KV cache)."""
        return self.body(inputs_embeds=self.mix(features, embeddings), use_cache=False).last_hidden_state


def head_config(
    target_config, intermediate: int | None = None, feature_layers: tuple[int, ...] = (), layers: int = 1
) -> LlamaConfig:
    """A Llama of `layers` decoder layers shaped like the target's (same width, heads, RoPE), reading
    the residual streams after `feature_layers` decoder layers of the target beside its final state."""
    heads = target_config.num_attention_heads
    config = LlamaConfig(
        vocab_size=1,
        hidden_size=target_config.hidden_size,
        intermediate_size=intermediate or target_config.intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=getattr(target_config, "num_key_value_heads", heads),
        head_dim=getattr(target_config, "head_dim", None) or target_config.hidden_size // heads,
        max_position_embeddings=target_config.max_position_embeddings,
        rope_parameters=getattr(target_config, "rope_parameters", None)
        or {"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=getattr(target_config, "rms_norm_eps", 1e-5),
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=False,
    )
    config.feature_layers = list(feature_layers)  # kept in the head's config.json
    return config


def _fingerprint_rows(vocab: int) -> torch.Tensor:
    return torch.linspace(0, vocab - 1, 32).long()


def fingerprint(output_layer: torch.Tensor) -> torch.Tensor:
    """256 values of the target's output layer: enough to tell its target from another model of the
    same shape, loose enough (compared by cosine) for the same model in another dtype or quantization."""
    rows = _fingerprint_rows(output_layer.shape[0])
    return output_layer.detach()[rows.to(output_layer.device), :8].float().flatten().cpu()


def model_fingerprint(model: PreTrainedModel | LlamaCppModel) -> torch.Tensor:
    """`fingerprint` of a loaded target's output layer, reading only the rows it takes."""
    matrices = matrices_of(model)
    rows = _fingerprint_rows(output_projection(matrices).weight.shape[0])
    return output_rows(matrices, rows)[:, :8].float().flatten().cpu()


def save_head(
    head: FeatureHead,
    folder: Path,
    vocab_width: int,
    target_name: str,
    target_print: torch.Tensor,
    output_ids: torch.Tensor | None = None,
    card: str | None = None,
) -> None:
    from safetensors.torch import save_file

    config = head.config.to_dict()
    config[HEAD_KEY] = {
        "target": target_name,
        "hidden_size": head.config.hidden_size,
        "vocab_width": vocab_width,
        "fingerprint": [round(v, 5) for v in target_print.tolist()],
    }
    state = {
        name: tensor.detach().to("cpu", torch.float16).contiguous()
        for name, tensor in head.state_dict().items()
        if not name.startswith("body.embed_tokens")
    }
    with building_folder(folder) as staging:  # a reader never loads half a head
        (staging / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        # with its size and digest beside it, checked at every load
        write_with(staging / "model.safetensors", lambda temporary: save_file(state, temporary), record=True)
        if output_ids is not None:
            (staging / OUTPUT_TOKENS_FILE).write_text(json.dumps({"token_ids": output_ids.tolist()}), encoding="utf-8")
        if card is not None:
            (staging / "README.md").write_text(card, encoding="utf-8")


def load_head(
    folder: Path, target_model: PreTrainedModel | LlamaCppModel, target_name: str
) -> tuple[FeatureHead, torch.Tensor | None]:
    """The head in `folder`, on the target's device and dtype, checked against the target; with its
    output tokens if it has a reduced list."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = folder / "config.json"
    try:
        raw = read_json(path, "The feature head's config")
        meta = raw.pop(HEAD_KEY)
        config = LlamaConfig(**raw)
    except (SpecDeckError, ValueError, KeyError, TypeError) as error:
        raise SpecDeckError(
            f"{folder} is not a feature head ({error}): it needs a config.json written by `specdeck train-head`."
        ) from error
    width = target_model.config.hidden_size
    weight = output_projection(matrices_of(target_model)).weight
    vocab = weight.shape[0]
    same = meta.get("hidden_size") == width and meta.get("vocab_width") == vocab
    if same and meta.get("fingerprint"):
        same = (
            torch.nn.functional.cosine_similarity(
                model_fingerprint(target_model), torch.tensor(meta["fingerprint"]), dim=0
            )
            > 0.9
        )
    if not same:
        raise SpecDeckError(
            f"The feature head in {folder} was trained for {meta.get('target', 'another target')} "
            f"(hidden size {meta.get('hidden_size')}, vocabulary {meta.get('vocab_width')}), not for "
            f"{target_name} (hidden size {width}, vocabulary {vocab}, other weights): a head only works with "
            "its own target."
        )
    head = FeatureHead(config)
    weights = folder / "model.safetensors"
    if record_path(weights).is_file() and (damage := recorded_damage(weights)):  # heads saved before records: none
        raise SpecDeckError(
            f"The feature head's weights in {weights} are damaged ({damage}): train the head again, "
            "or restore the folder from where it came."
        )
    try:
        state = load_file(weights)
    except (OSError, SafetensorError) as error:
        raise SpecDeckError(
            f"Could not read the feature head's weights in {folder} ({error}): the file is missing or corrupt."
        ) from error
    missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [name for name in missing if not name.startswith("body.embed_tokens")]
    if missing or unexpected:
        raise SpecDeckError(
            f"The feature head's weights in {folder} do not match its config "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})."
        )
    head.to(device=weight.device, dtype=weight.dtype).eval()
    return head, read_output_tokens(folder, vocab)


def load_feature_head_weights(head: FeatureHead, name: str) -> list[str]:
    """Copy the weights of the head `name` (a folder or a built-in alias) into `head` where their
    names match (a head that grows fusion weights starts from one without); return the names of
    `head`'s weights it did not have."""
    from safetensors.torch import load_file

    state = load_file(Path(locate(name)) / "model.safetensors")
    try:
        missing, unexpected = head.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    except RuntimeError as error:  # a weight of another size
        raise SpecDeckError(f"The head {name} has another shape than the one to train: {error}") from error
    if unexpected:
        raise SpecDeckError(f"The head {name} has weights this head lacks ({unexpected[:3]}): another shape.")
    return [n for n in missing if not n.startswith("body.embed_tokens")]


@dataclass
class LoadedHead:
    name: str
    head: FeatureHead
    output_ids: torch.Tensor | None


def load_feature_head(name: str, target: LoadedModel, progress: Progress | None = None) -> LoadedHead:
    """The feature head `name` (alias, folder or Hugging Face id) bound to its target, or a clear error."""
    folder = Path(locate(name.strip(), progress))
    if progress:
        progress(f"Loading {name}")
    if not is_head_folder(folder):
        raise SpecDeckError(
            f"{name} is not a feature head (its config.json has no {HEAD_KEY!r} entry). "
            "For a separate draft model choose the draft-model drafter."
        )
    if any(getattr(target.model.config, key, None) for key in ("final_logit_softcapping", "logit_scale")):
        raise SpecDeckError(
            f"{target.name} rescales its logits after the output layer, which feature heads do not support: "
            "use a draft model or prompt lookup."
        )
    head, output_ids = load_head(folder, target.model, target.name)
    return LoadedHead(name, head, output_ids)
