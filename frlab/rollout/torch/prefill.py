"""How the torch engine prefills newly admitted prompts: left-padded rows, or one packed row.

Left-padding ragged prompts runs every padding position through every layer. Packing them end
to end in ONE row, position ids restarting at 0 per prompt and a block-diagonal causal mask
(transformers' own packed-sequence mask, passed in as a ready 4D mask), computes real tokens
only, but its attention spans the whole row. `PrefillCost` estimates both from the model's
shape and the engine takes the cheaper for each group of consecutive prompts; the KV cache of
a packed row is then split into the usual left-padded rows (kv_batch.unpack_rows), so decoding
is the same either way. Packing is used only where it is known to be exact: sdpa or eager
attention, no sliding-window layers, and a check at start that a packed forward gives the
logits of separate forwards (else the engine warns and pads).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import torch

from frlab.model.lora import base_of

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

MIN_PACK_TOKENS = 256  # a packed row may always hold this many prompt tokens
MAX_PACK_TOKENS = 4096  # and never more (its [S, S] attention scores are materialised)
# a packed row is cut where its attention would cost this share of its linear layers
ATTENTION_SHARE = 0.25
CHECK_PROMPTS = ([1, 2, 3], [4, 5])  # the start check: two prompts, packed vs separate
# allowed max |logit difference| of the start check, relative to the largest |logit|: float
# noise of the weights' dtype, far below what a mask leaking across prompts gives
CHECK_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-3}
CHECK_TOLERANCE_LOW_PRECISION = 5e-2  # bf16 / fp16


@dataclass(frozen=True)
class PrefillCost:
    """FLOPs of one prefill forward: `linear` per token (every weight matrix but the
    embeddings; of MoE experts only the share a token is routed to), `attention` per
    (query, key) pair (scores and weighted values, all layers)."""

    linear: float
    attention: float

    @classmethod
    def of(cls, model: PreTrainedModel) -> PrefillCost:
        config = model.config.get_text_config()
        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        embeddings = {id(p) for p in model.get_input_embeddings().parameters()}
        output = model.get_output_embeddings()
        embeddings |= {id(p) for p in output.parameters()} if output is not None else set()
        routed = active_expert_share(config)
        weights = sum(
            p.numel() * (routed if "experts" in name.split(".") else 1.0)
            for name, p in model.named_parameters()
            if id(p) not in embeddings
        )
        return cls(2.0 * weights, 4.0 * heads * head_dim * int(config.num_hidden_layers))

    @property
    def max_pack_tokens(self) -> int:
        """Tokens per packed row: where attention reaches ATTENTION_SHARE of the linear cost."""
        share = int(ATTENTION_SHARE * self.linear / self.attention)
        return min(MAX_PACK_TOKENS, max(MIN_PACK_TOKENS, share))

    def padded(self, lengths: list[int]) -> float:
        width = max(lengths)
        return len(lengths) * width * (self.linear + self.attention * width)

    def packed(self, lengths: list[int]) -> float:
        total = sum(lengths)
        return total * (self.linear + self.attention * total)


def active_expert_share(config: object) -> float:
    """The share of an MoE layer's experts each token runs through (1.0 without experts)."""
    experts = next(
        (
            getattr(config, k, None)
            for k in ("num_experts", "num_local_experts", "n_routed_experts")
            if getattr(config, k, None)
        ),
        None,
    )
    routed = getattr(config, "num_experts_per_tok", None)
    return float(routed) / float(experts) if experts and routed else 1.0


def plan(lengths: list[int], cost: PrefillCost | None) -> list[tuple[list[int], bool]]:
    """Groups of consecutive prompt indices, one prefill forward each, and whether that forward
    packs (True) or pads (False). Rows to pack are cut at `max_pack_tokens`; consecutive
    groups that would not pack are joined into one padded forward (as without packing)."""
    if cost is None:
        return [(list(range(len(lengths))), False)]
    groups: list[list[int]] = [[]]
    tokens = 0
    for i, n in enumerate(lengths):
        if groups[-1] and tokens + n > cost.max_pack_tokens:
            groups.append([])
            tokens = 0
        groups[-1].append(i)
        tokens += n
    out: list[tuple[list[int], bool]] = []
    for group in groups:
        sizes = [lengths[i] for i in group]
        packed = len(group) > 1 and cost.packed(sizes) < cost.padded(sizes)
        if not packed and out and not out[-1][1]:
            out[-1][0].extend(group)
        else:
            out.append((group, packed))
    return out


def packed_inputs(
    prompts: list[list[int]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ids [1, S] of the prompts end to end, position ids [1, S] (0 at each prompt's start),
    and each prompt's last index in the row [n]."""
    lengths = torch.tensor([len(p) for p in prompts])
    ids = torch.tensor([[t for p in prompts for t in p]], dtype=torch.long)
    positions = torch.cat([torch.arange(len(p)) for p in prompts]).unsqueeze(0)
    return ids.to(device), positions.to(device), (lengths.cumsum(0) - 1).to(device)


@cache
def mask_parameters() -> frozenset[str]:
    """The arguments of this transformers' `create_causal_mask` (they changed across releases)."""
    from transformers.masking_utils import create_causal_mask

    return frozenset(inspect.signature(create_causal_mask).parameters)


def packed_mask(model: PreTrainedModel, positions: torch.Tensor) -> torch.Tensor:
    """The 4D block-diagonal causal mask transformers builds for a packed row (sdpa: bool,
    eager: additive float); RuntimeError when it builds none (a single prompt needs none)."""
    from transformers.masking_utils import create_causal_mask

    length = positions.shape[1]
    shape_only = torch.empty((1, length, 1), dtype=model.dtype, device=positions.device)
    kwargs: dict[str, object] = {"attention_mask": None, "position_ids": positions}
    kwargs.update({k: None for k in ("cache", "past_key_values") if k in mask_parameters()})
    if "cache_position" in mask_parameters():  # transformers < 5.9 indexes queries with it
        kwargs["cache_position"] = torch.arange(length, device=positions.device)
    mask = create_causal_mask(model.config.get_text_config(), shape_only, **kwargs)
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        raise RuntimeError(f"transformers built no 4D packed mask (got {type(mask).__name__})")
    return mask


def unsupported(model: PreTrainedModel) -> str | None:
    """Why packed prefill is not used for `model` (None: it may be)."""
    config = model.config.get_text_config()
    attn = getattr(config, "_attn_implementation", None) or "eager"
    if attn not in ("sdpa", "eager"):
        return f"attention implementation {attn!r} (packing needs sdpa or eager)"
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) or (
        not layer_types and getattr(config, "sliding_window", None) is not None
    ):
        return "sliding-window attention layers"
    if "position_ids" not in inspect.signature(base_of(model).forward).parameters:
        return "the model's forward takes no position_ids"  # (a LoRA PeftModel passes them on)
    return None


Logits = Callable[
    [torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None], torch.Tensor
]


def agrees(model: PreTrainedModel, forward: Logits, device: torch.device) -> str | None:
    """Run CHECK_PROMPTS packed and one by one through `forward(ids, mask, positions, keep)`
    (last-position logits); None when they agree, else what differed."""
    vocab = int(model.get_input_embeddings().weight.shape[0])
    prompts = [[t % vocab for t in p] for p in CHECK_PROMPTS]
    ids, positions, last = packed_inputs(prompts, device)
    together = forward(ids, packed_mask(model, positions), positions, last).float()
    alone = torch.cat(
        [forward(torch.tensor([p], device=device), None, None, None).float() for p in prompts]
    )
    gap = float((together - alone).abs().max())
    scale = float(alone.abs().max()) or 1.0
    tolerance = CHECK_TOLERANCE.get(model.dtype, CHECK_TOLERANCE_LOW_PRECISION)
    return None if gap <= tolerance * scale else f"max |logit gap| {gap:.3g} of {scale:.3g}"


def packing_cost(
    model: PreTrainedModel, logits: Callable[..., torch.Tensor], device: torch.device, enabled: bool
) -> PrefillCost | None:
    """The prefill cost model when prompts may be packed (None: always left-padded): packing
    must be asked for, supported by the model, and agree with separate forwards at start."""
    if not enabled:
        return None
    reason = unsupported(model)
    if reason is None:
        try:
            with torch.inference_mode():
                reason = agrees(model, logits, device)
        except Exception as exc:  # a model that cannot take a packed row: pad instead
            reason = f"packed forward failed: {exc!r}"
    if reason is not None:
        log.warning("torch engine: prompts are prefilled left-padded, not packed: %s", reason)
        return None
    return PrefillCost.of(model)
