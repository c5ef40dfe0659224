"""The feature head as a drafter (`specdeck.engine.drafting.heads.FeatureHead`: EAGLE, Li et al. 2024): it drafts from
the target's own states, which the decoding loop hands it for every kept token (`Drafter.observe`),
on products of the target's output rows it may propose and, beside a GGUF target, on Q8_0 blocks of
its own weights."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch

from specdeck.engine.drafting.drafters import Drafter
from specdeck.engine.drafting.proposals import DrawnChain, Proposal
from specdeck.engine.forward import gguf_blocks
from specdeck.engine.forward.hf_parts import input_embedding
from specdeck.engine.forward.kvcache import backend_for
from specdeck.engine.forward.lean_weights import output_rows
from specdeck.engine.forward.linear import Linear, PathChoice, bfloat16_pays, make_linear
from specdeck.engine.forward.llama_families import supports
from specdeck.engine.forward.llama_forward import LlamaForward, output_layer
from specdeck.engine.forward.llamacpp_backend import LlamaCppModel, matrices_of
from specdeck.engine.forward.row_kernel import QuantizedLinear
from specdeck.engine.planner.round_shape import ProposalShape
from specdeck.engine.sampling import logits_to_probs

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from specdeck.engine.drafting.heads import FeatureHead


class FeatureHeadDrafter(Drafter):
    """Drafts from the target's own last hidden state (`specdeck.engine.drafting.heads.FeatureHead`).

    The head's cache holds one pair (state f_i, token i+1) per kept token it has seen: every kept
    token but the newest. A round feeds the pairs that became known since the last one, then drafts
    by feeding back its own predicted states; those predicted pairs are cropped away next round,
    when the target's real states replace them.

    Kept tokens whose states the target did not compute (`skip`: rounds that drafted nothing from
    the head) are a gap: the head pairs the latest GAP_FILL of them with its own predicted states,
    as when drafting, and leaves older ones out of its cache; so does a run of real states after
    the prompt longer than CATCH_UP (a long stretch of plain steps or copied tokens): its latest
    CATCH_UP are paired. Its drafts then rest on less, which changes how many pass, never the
    text. The prompt's states are all paired, at prefill, in forwards of PAIR_CHUNK: the head reads
    the whole prompt, as it trained on whole conversations.
    """

    needs_states = True
    GAP_FILL = 4  # gap tokens paired with predicted states: each costs a step of the head's layer
    # real states after the prompt paired at once, at most: the latest of a longer run, paid in the
    # round that drafts, where pairing every copied token costs more than its drafts gain
    CATCH_UP = 32
    # the prompt's states paired in one forward, at most: bounds a long prompt's attention scores
    PAIR_CHUNK = 512

    def __init__(
        self,
        head: FeatureHead,
        target: PreTrainedModel | LlamaCppModel,
        name: str = "feature head",
        output_ids: torch.Tensor | None = None,
    ) -> None:
        self.name = name
        matrices = matrices_of(target)
        self._embedding = input_embedding(matrices)
        self.device = self._embedding.weight.device
        # in increasing order: q over them widens to the whole vocabulary in one pass through memory
        self._output_ids = None if output_ids is None else output_ids.to(self.device, torch.long).sort().values
        rows = None if self._output_ids is None else output_rows(matrices, self._output_ids).contiguous()
        # bfloat16 where this machine computes it faster (`bfloat16_pays`): a head with a reduced
        # output vocabulary drafts in it, on a copy (the head loaded stays as trained)
        # a GGUF target's head: its layer on Q8_0 blocks of its own weights too, where they run (then
        # not in bfloat16, which would take it off them)
        if isinstance(target, LlamaCppModel) or gguf_blocks.source_of(target) is not None:
            gguf_blocks.quantize_for_drafting(head.body)
        weights = [p for p in head.parameters() if p.dim() == 2] + ([rows] if rows is not None else [])
        self.precision: PathChoice | None
        if gguf_blocks.own_blocks(head.body):
            self.precision = PathChoice("float32", "its layer multiplies on Q8_0 blocks of its own weights")
        else:
            self.precision = bfloat16_pays(weights) if rows is not None else None
        if self.precision is not None and self.precision.path == "bfloat16" and rows is not None:
            head, rows = copy.deepcopy(head).to(torch.bfloat16), rows.to(torch.bfloat16)
        self.head = self.module = head
        self.dtype = next(head.parameters()).dtype
        self.feature_layers = head.feature_layers
        self._body = backend_for(head.body)  # the head's decoder layer and its KV cache
        if isinstance(self._body, LlamaForward):
            self._body.fused_first_chunk = True  # its first pairs after a prompt in one kernel call too
        # the target's own output layer (shared with its lean forward), or a product of the rows it may propose
        if rows is None or self._output_ids is None:
            self._output = output_layer(matrices)
        else:
            self._output = _rows_product(matrices, self._output_ids, rows)
        # the map of (state, embedding) pairs into the layer, on the layer's kind of blocks: 0.7 MB, not 2.7
        self._fc: Linear | torch.nn.Module = head.fc
        # and the fusion of a head that reads lower layers (once per kept token), likewise
        self._fuse_fc: Linear | torch.nn.Module | None = getattr(head, "fuse_fc", None)
        if gguf_blocks.own_blocks(head.body):
            self._fc = gguf_blocks.OwnMatrices().product(["own"], [head.fc.weight], None) or head.fc
            if self._fuse_fc is not None:
                own = gguf_blocks.OwnMatrices().product(["own"], [self._fuse_fc.weight], None)
                self._fuse_fc = own or self._fuse_fc

    def begin(self, prompt_ids, config, vocab_width, generator) -> None:
        super().begin(prompt_ids, config, vocab_width, generator)
        self._body.reset()
        self._seen = 0  # kept tokens (but the newest) the head has dealt with: paired, or left out
        self._cached = 0  # pairs in the head's cache, real or filled (no draft's)
        self._next: torch.Tensor | None = None  # the state the head predicts after its latest pair
        self._pending: list[torch.Tensor | int] = []  # real states not paired yet, or a gap's length
        self._prompt: list[int] | None = list(prompt_ids)  # until its states are paired

    @torch.inference_mode()
    def observe(self, states: torch.Tensor) -> None:
        self._pending.append(states)
        # the prompt's states, handed over at prefill, are paired then: reading the prompt is the
        # head's prefill, as a draft model's forward over it in `begin` is its own
        if self._prompt is not None and len(states) == len(self._prompt) - 1:
            self._catch_up(self._prompt, whole=True)
        self._prompt = None

    def skip(self, count: int) -> None:
        self._prompt = None
        if count:
            self._pending.append(count)

    def _pair(self, states: torch.Tensor, following: torch.Tensor) -> torch.Tensor:
        """The head's predicted next states for pairs (state, following token) after its cache."""
        return self._body.hidden_from_inputs(self.head.mix(states, self._embedding(following).to(self.dtype), self._fc))

    def _catch_up(self, ids: list[int], whole: bool = False) -> None:
        """Pair every kept token but the newest: real states in one step (the latest CATCH_UP of a
        run, all of them where `whole`), a gap from predictions."""
        self._body.crop(self._cached)  # forget the states predicted last round
        for part in _runs(self._pending):
            if isinstance(part, int):
                start = self._seen + max(0, part - self.GAP_FILL)  # older gap tokens are left out
                self._seen += part
                for i in range(start, self._seen):
                    previous = self._next
                    if previous is None:  # no state yet to predict from: the gap stays out
                        break
                    self._next = self._pair(previous[None], torch.tensor([ids[i + 1]], device=self.device))[-1]
                    self._cached += 1
            else:
                left_out = 0 if whole else max(0, len(part) - self.CATCH_UP)  # the oldest stay out
                part, self._seen = part[left_out:], self._seen + left_out
                for chunk in part.split(self.PAIR_CHUNK):
                    n = len(chunk)
                    following = torch.tensor(ids[self._seen + 1 : self._seen + n + 1], device=self.device)
                    self._next = self._pair(self.head.fuse(chunk.to(self.dtype), self._fuse_fc), following)[-1]
                    self._seen += n
                    self._cached += n
        self._pending = []
        if self._seen != len(ids) - 1:
            raise RuntimeError(
                f"the head has heard of {self._seen} kept tokens, the session kept {len(ids) - 1}: "
                "each proposal needs the states (or a skip) of the tokens kept since the last one"
            )

    @torch.inference_mode()
    def propose(self, ids: list[int], shape: ProposalShape) -> Proposal:
        self._catch_up(ids)
        predicted = self._next
        if predicted is None:
            return self._empty(self.device)
        chain = DrawnChain(self.config, self.generator, shape)
        for step in range(shape.k):
            # with output ids, q over the head's output tokens alone (0 elsewhere): a sixth of the vocabulary
            q = logits_to_probs(self._output(predicted).float(), self.config)
            token = chain.draw(q, self._output_ids, self.vocab_width)
            if token is None or not chain.open or step == shape.k - 1:
                break
            predicted = self._pair(predicted[None], torch.tensor([token], device=self.device))[-1]
        return chain.proposal(self.vocab_width, self.device)


def _rows_product(matrices, ids: torch.Tensor, rows: torch.Tensor) -> Linear:
    """A product of the target's output rows `ids` (values `rows`): on the GGUF file's blocks where
    the target's output layer reads them (`specdeck.engine.forward.gguf_blocks`; the same bits, a quarter of the
    bytes), else on `rows`."""
    if rows.dtype == torch.float32 and not isinstance(matrices, LlamaCppModel) and supports(matrices):
        whole = output_layer(matrices)
        if isinstance(whole, QuantizedLinear) and (cut := whole.rows(ids.cpu().numpy())) is not None:
            return cut
    return make_linear(rows)


def _runs(parts: list[torch.Tensor | int]) -> list[torch.Tensor | int]:
    """`parts` with each run of consecutive states joined: the head pairs a run in one forward
    (several plain steps' states after rounds that drafted nothing: one step of the head's layer,
    not one per token). Each run is joined in one copy: a long run of plain steps' rows, joined one
    by one, would copy the run again at every row."""
    grouped: list[list[torch.Tensor] | int] = []
    for part in parts:
        if isinstance(part, int):
            grouped.append(part)
        elif grouped and isinstance(grouped[-1], list):
            grouped[-1].append(part)
        else:
            grouped.append([part])
    return [group if isinstance(group, int) else torch.cat(group) for group in grouped]
