"""What a feature head (`specdeck.train.head`) is trained and measured on: pairs of the target's
states and the next tokens, passes unrolled as drafting runs them (training-time test, EAGLE-3, Li
et al. 2025), the loss over them and the head's top-1 agreement with the target by draft depth.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from specdeck.engine.drafting.heads import FeatureHead
from specdeck.train.teacher import Shard

if TYPE_CHECKING:
    from specdeck.train.head import HeadConfig


def collate_pairs(
    data: Shard,
    features: list[torch.Tensor],
    rows: list[int],
    embedding: torch.Tensor,
    columns: list[int] | int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded states (B, W, h), next-token embeddings for pairs (B, W-1, h), and the mask of the
    pairs that count: those in the answer. Pair i predicts the state after token i+1, which decides
    token i+2; the head drafts from the token after the target's first answer token on, so pairs
    before `first` (the prompt, which the head only reads) are left out of the loss. Features of
    several layers (L, m, h) give states (B, W, m, h); `columns` picks some of them (an int: one,
    as (B, W, h))."""
    width = max(len(data.ids[r]) for r in rows)
    hidden = embedding.shape[1]
    picked = [features[r] if columns is None else features[r][:, columns] for r in rows]
    states = torch.zeros(len(rows), width, *picked[0].shape[1:-1], hidden)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width - 1, dtype=torch.bool)
    for j, r in enumerate(rows):
        n = len(data.ids[r])
        states[j, :n] = picked[j].float()
        ids[j, :n] = data.ids[r].long()
        mask[j, data.first[r] : n - 1] = True
    return states, embedding[ids[:, 1:]], mask


def _pass_mask(width: int, s: int) -> torch.Tensor:
    """Which keys query j of pass s (0-based) attends to, over the keys of passes 0..s side by side:
    the real pairs up to j - s, then pass r's pair at j - s + r for r = 1..s (the drafts a depth-(s+1)
    draft follows in the cache)."""
    blocks = [torch.ones(width, width, dtype=torch.bool).tril(-s)]
    blocks += [torch.ones(width, width, dtype=torch.bool).tril(r - s).triu(r - s) for r in range(1, s + 1)]
    return torch.cat(blocks, dim=1)


def unrolled(head: FeatureHead, inputs: torch.Tensor, embeds: torch.Tensor, passes: int) -> list[torch.Tensor]:
    """Predicted states (B, W, h) of each pass: pass 0 reads the real input states `inputs`, pass s
    the states pass s-1 predicted one pair earlier, each attending as `_pass_mask` says."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    body: Any = head.body  # a Hugging Face LlamaModel, read by its submodules' names
    config = head.config
    batch, width, _ = inputs.shape
    dim = config.head_dim or config.hidden_size // config.num_attention_heads
    keys: list[list[torch.Tensor]] = [[] for _ in body.layers]  # per layer, each pass's
    values: list[list[torch.Tensor]] = [[] for _ in body.layers]
    outputs = []
    states = inputs
    cos = sin = None
    for s in range(passes):
        x = head.mix(states, embeds)
        if cos is None:
            cos, sin = body.rotary_emb(x, torch.arange(width, device=x.device)[None])
        mask = _pass_mask(width, s).to(x.device)
        for number, layer in enumerate(body.layers):
            attention = layer.self_attn
            h = layer.input_layernorm(x)
            q = attention.q_proj(h).view(batch, width, -1, dim).transpose(1, 2)
            k = attention.k_proj(h).view(batch, width, -1, dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            keys[number].append(k)
            values[number].append(attention.v_proj(h).view(batch, width, -1, dim).transpose(1, 2))
            out = torch.nn.functional.scaled_dot_product_attention(
                q,
                torch.cat(keys[number], dim=2),
                torch.cat(values[number], dim=2),
                attn_mask=mask,
                scale=dim**-0.5,
                enable_gqa=True,
            )
            x = x + attention.o_proj(out.transpose(1, 2).reshape(batch, width, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        predicted = body.norm(x)
        outputs.append(predicted)
        # the next pass reads, at pair j, the state this pass predicted at pair j-1
        states = torch.cat([inputs[:, :1], predicted[:, :-1].to(inputs.dtype)], dim=1)
    return outputs


def copyable_pairs(ids: torch.Tensor) -> torch.Tensor:
    """(B, W-1): whether prompt lookup could copy pair j's token, the one after ids[j + 1], because
    the two tokens ending there, ids[j] and ids[j + 1], already stand together earlier in the row.
    Beside prompt lookup a head drafts the other pairs, so they are what its training weighs."""
    width = ids.shape[1]
    if width < 2:
        return torch.zeros(ids.shape[0], max(width - 1, 0), dtype=torch.bool, device=ids.device)
    codes = ids[:, :-1].long() * (int(ids.max()) + 1) + ids[:, 1:].long()  # the pair ending at t + 1
    order = torch.sort(codes, dim=1, stable=True).indices  # stable: a code's first place comes first
    ordered = codes.gather(1, order)
    repeat = torch.zeros_like(ordered, dtype=torch.bool)
    repeat[:, 1:] = ordered[:, 1:] == ordered[:, :-1]
    return torch.zeros_like(repeat).scatter(1, order, repeat)


def reach(mask: torch.Tensor, step: int) -> torch.Tensor:
    """The pairs pass `step` (0-based) drafts: pair j's depth-(step+1) draft follows the real pairs
    up to j - step, so the first `step` pairs of a row have none."""
    reached = mask.clone()
    reached[:, :step] = False
    return reached


def head_loss(
    head: FeatureHead,
    states,
    embeds,
    mask,
    weight: torch.Tensor,
    config: HeadConfig,
    noise_seed: int | None = None,
    copyable: torch.Tensor | None = None,
    copy_weight: float = 1.0,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The loss over every pass, and per pass whether the head's argmax equals the target's at each
    pair that pass can draft (`reach`). `states` are the target's, (B, W, h) or (B, W, m, h) with the
    final state last. With `noise_seed` (training) the input states get noise drawn from that seed.
    Pairs marked `copyable` (`copyable_pairs`) weigh `copy_weight` in the loss, the others 1."""
    final = states[..., -1, :] if states.dim() == 4 else states
    truth = final[:, 1:]
    device = states.device
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.bfloat16):
        inputs = head.fuse(states[:, :-1])
    inputs = inputs.float()
    if noise_seed is not None and config.noise:
        generator = torch.Generator(device).manual_seed(noise_seed)
        noise = torch.randn(inputs.shape, generator=generator, device=device)
        inputs = inputs + noise * config.noise * inputs.pow(2).mean().sqrt()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.bfloat16):
        predictions = unrolled(head, inputs, embeds, config.unroll)
    total, agreements = torch.zeros((), device=device), []
    for step, predicted in enumerate(predictions):
        reached = reach(mask, step)
        with torch.no_grad():
            p = torch.softmax(torch.nn.functional.linear(truth[reached], weight), dim=-1)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.bfloat16):
            logits = torch.nn.functional.linear(predicted[reached], weight)
        logq = torch.log_softmax(logits.float(), dim=-1)
        cross = -(p * logq).sum(-1)
        if copyable is not None and copy_weight != 1.0:
            weights = torch.where(copyable[reached], copy_weight, 1.0)
            loss = (cross * weights).sum() / weights.sum().clamp_min(1e-6)
        else:
            loss = cross.mean()
        if config.feature_weight:
            loss = loss + config.feature_weight * torch.nn.functional.smooth_l1_loss(
                predicted[reached].float(), truth[reached]
            )
        total = total + loss / (step + 1)
        agreements.append((logits.argmax(-1) == p.argmax(-1)).float().detach())
    return total, agreements


@torch.no_grad()
def evaluate(head, data, features, rows, embedding, weight, config, columns=None) -> list[float]:
    """Top-1 agreement with the target over `rows`, by draft depth (one figure per pass)."""
    head.eval()
    totals: list[list[torch.Tensor]] = [[] for _ in range(config.unroll)]
    for i in range(0, len(rows), config.batch_sequences):
        _, agreements = head_loss(
            head,
            *collate_pairs(data, features, rows[i : i + config.batch_sequences], embedding, columns),
            weight,
            config,
        )
        for pass_no, agree in enumerate(agreements):
            totals[pass_no].append(agree)
    head.train()
    return [torch.cat(t).mean().item() for t in totals]
