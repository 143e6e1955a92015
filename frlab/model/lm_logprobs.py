"""Per-token log-probs of a causal LM without materialising `[B, T, V]` logits.

The learner needs `log pi_theta(y_t | y_<t)` for every policy token (the FlashREINFORCE
token ratio `rho = exp(logp - behaviour)` and the loss are built from it). With 8k-16k token
contexts and 152k vocabularies, `model(...).logits` alone is tens of GB. Instead we run the
decoder to its final hidden states, gather the hidden states of the positions that are scored
(only policy tokens, when an action mask is given) and push them through the LM head
`chunk_size` rows at a time. A custom autograd Function keeps only the hidden states, the head
weight and a per-row log-sum-exp; backward recomputes each chunk's logits and accumulates the
gradients of the hidden states, the head weight and its bias.

Numerics: the head matmul runs in the operands' dtype (or the active autocast dtype, as the
model's own forward would), the softmax in float32 (float64 for float64 models).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from frlab.model.lora import base_of
from frlab.ops.logprobs import (
    check_chunking,
    check_targets,
    chunk_stats_,
    compute_dtype_for,
    rows_per_chunk,
    softmax_grad_,
)

# Config keys whose models transform logits after the LM head (cap or rescale): the chunked
# head below would compute a different distribution, so such models are refused.
SOFTCAP_KEYS = ("final_logit_softcapping", "softcap")
SCALE_KEYS = ("logit_scale", "logits_scaling", "lm_head_multiplier", "output_multiplier")


def matmul_dtype(hidden: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype the head matmul would run in: the autocast dtype if active, else promoted."""
    promoted = torch.promote_types(hidden.dtype, weight.dtype)
    device_type = hidden.device.type
    if promoted != torch.float64 and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return promoted


def _head_chunk(
    h: Tensor, w: Tensor, b: Tensor | None, mm: torch.dtype, cdtype: torch.dtype, tau: float
) -> Tensor:
    """Fresh tempered logits of one row chunk: (h W^T + b) / tau in the compute dtype."""
    z = F.linear(h.to(mm), w, b).to(cdtype)
    return z.div_(tau) if tau != 1.0 else z


class _ChunkedLMHeadLogProb(torch.autograd.Function):
    """(hidden [N,H], weight [V,H], bias [V]|None) -> (logp [N], entropy [N] detached)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        temperature: float,
        chunk_size: int,
        compute_entropy: bool,
        mm_dtype: torch.dtype,
    ) -> tuple[Tensor, Tensor]:
        cdtype = compute_dtype_for(mm_dtype)
        n, dev = hidden.shape[0], hidden.device
        logp = torch.empty(n, dtype=cdtype, device=dev)
        lse = torch.empty(n, dtype=cdtype, device=dev)
        entropy = torch.zeros(n if compute_entropy else 0, dtype=cdtype, device=dev)
        with torch.autocast(dev.type, enabled=False):
            w = weight.to(mm_dtype)
            b = None if bias is None else bias.to(mm_dtype)
            for s in range(0, n, chunk_size):
                e = min(s + chunk_size, n)
                z = _head_chunk(hidden[s:e], w, b, mm_dtype, cdtype, temperature)
                lp, ls, ent = chunk_stats_(z, targets[s:e], compute_entropy)
                logp[s:e], lse[s:e] = lp, ls
                if ent is not None:
                    entropy[s:e] = ent
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature, ctx.chunk_size, ctx.mm_dtype = temperature, chunk_size, mm_dtype
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad_logp: Tensor, _grad_entropy: Tensor
    ) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        mm, tau, cdtype = ctx.mm_dtype, ctx.temperature, lse.dtype
        n = hidden.shape[0]
        grad_h = torch.empty_like(hidden) if need_h else None
        # Accumulate the head's gradient over chunks in the compute dtype, cast once at the end.
        grad_w = torch.zeros(weight.shape, dtype=cdtype, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=cdtype, device=bias.device) if need_b else None
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(mm)
            b = None if bias is None else bias.to(mm)
            for s in range(0, n, ctx.chunk_size):
                e = min(s + ctx.chunk_size, n)
                h = hidden[s:e].to(mm)
                z = _head_chunk(h, w, b, mm, cdtype, tau)
                g = softmax_grad_(z, lse[s:e], targets[s:e], grad_logp[s:e].to(cdtype), tau)
                g_mm = g.to(mm)
                if grad_h is not None:
                    grad_h[s:e] = g_mm @ w
                if grad_w is not None and mm == cdtype:
                    grad_w.addmm_(g_mm.t(), h)  # no [V, H] temporary
                elif grad_w is not None:
                    grad_w += g_mm.t() @ h  # low-precision matmul, summed in float32
                if grad_b is not None:
                    grad_b += g.sum(dim=0)
        return (
            grad_h,
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            None, None, None, None, None,
        )  # fmt: skip


def logprobs_from_hidden(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    compute_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """`log softmax((hidden @ weight.T + bias) / temperature)[targets]`, chunked over rows.

    hidden [N,H], weight [V,H], bias [V] or None, targets long [N]. Returns `(logp [N],
    entropy [N] or None)` in float32 (float64 for float64 operands); `logp` is differentiable
    w.r.t. hidden, weight and bias, `entropy` is detached. `[N, V]` is never materialised and
    nothing of that size is kept for backward.
    """
    if not isinstance(hidden, Tensor) or hidden.dim() != 2 or not hidden.is_floating_point():
        raise ValueError(f"hidden must be a 2-D float [N, H] tensor, got {_describe(hidden)}")
    if not isinstance(weight, Tensor) or weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"weight must be a 2-D float [V, H] tensor, got {_describe(weight)}")
    if weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"weight is {list(weight.shape)} but hidden has H={hidden.shape[1]}")
    if weight.device != hidden.device:
        raise ValueError(f"weight is on {weight.device}, hidden on {hidden.device}")
    if bias is not None and (bias.shape != weight.shape[:1] or bias.device != hidden.device):
        raise ValueError(f"bias must have shape [{weight.shape[0]}] on {hidden.device}")
    if not isinstance(targets, Tensor):
        raise ValueError(f"targets must be a tensor, got {type(targets).__name__}")
    check_chunking(temperature, chunk_size)
    check_targets(targets, hidden.shape[0], weight.shape[0], hidden.device)
    mm = matmul_dtype(hidden, weight)
    logp, entropy = _ChunkedLMHeadLogProb.apply(
        hidden, weight, bias, targets, float(temperature),
        rows_per_chunk(chunk_size, weight.shape[0]), bool(compute_entropy), mm,
    )  # fmt: skip
    return logp, (entropy if compute_entropy else None)


def _describe(x: Any) -> str:
    if isinstance(x, Tensor):
        return f"{x.dtype} tensor of shape {list(x.shape)}"
    return type(x).__name__


def lm_parts(model: nn.Module) -> tuple[nn.Module, nn.Linear]:
    """(decoder, lm_head) of a HF causal LM (inside a LoRA PeftModel: its base model, whose
    layers carry the adapters), or a ValueError naming the model type."""
    model = base_of(model)
    config = getattr(model, "config", None)
    mtype = getattr(config, "model_type", type(model).__name__)
    configs = [config]
    if config is not None and hasattr(config, "get_text_config"):
        configs.append(config.get_text_config())
    for cfg in configs:
        for key in SOFTCAP_KEYS:
            if getattr(cfg, key, None) is not None:
                raise ValueError(
                    f"model type {mtype!r} caps its logits ({key}={getattr(cfg, key)}); "
                    "chunked LM-head log-probs do not support final logit softcapping"
                )
        for key in SCALE_KEYS:
            value = getattr(cfg, key, None)
            if value is not None and value != 1.0:
                raise ValueError(
                    f"model type {mtype!r} rescales its logits ({key}={value}); "
                    "chunked LM-head log-probs support only a plain linear LM head"
                )
    prefix = getattr(model, "base_model_prefix", "")
    decoder = getattr(model, prefix, None) if prefix else None
    if not isinstance(decoder, nn.Module) or decoder is model:
        raise ValueError(f"model type {mtype!r} has no base decoder at `{prefix or '?'}`")
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, nn.Linear):
        raise ValueError(
            f"model type {mtype!r} has LM head {type(head).__name__}; expected nn.Linear"
        )
    return decoder, head


def scored_positions(attention_mask: Tensor, action_mask: Tensor | None) -> Tensor:
    """Bool [B, T-1]: True where target token t+1 gets a log-prob (predicted from t)."""
    if action_mask is None:
        return attention_mask[:, 1:] & attention_mask[:, :-1]
    if bool(action_mask[:, 0].any()):
        raise ValueError("action_mask[:, 0] is True: the first token has no context to score")
    if bool((action_mask & ~attention_mask).any()):
        raise ValueError("action_mask is True where attention_mask is False (padding)")
    return action_mask[:, 1:]


def _check_sequence_inputs(
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor | None,
    action_mask: Tensor | None,
) -> None:
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
        raise ValueError(f"input_ids must be a long [B, T] tensor, got {_describe(input_ids)}")
    if not isinstance(attention_mask, Tensor):
        raise ValueError(f"attention_mask must be a [B, T] tensor, got {_describe(attention_mask)}")
    shape = input_ids.shape
    named = {
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "action_mask": action_mask,
    }
    for name, t in named.items():
        if t is None:
            continue
        if not isinstance(t, Tensor) or t.shape != shape:
            raise ValueError(f"{name} must have shape {list(shape)}, got {_describe(t)}")
        if t.device != input_ids.device:
            raise ValueError(f"{name} is on {t.device}, input_ids on {input_ids.device}")
    if action_mask is not None and action_mask.dtype != torch.bool:
        raise ValueError(f"action_mask must be torch.bool, got {action_mask.dtype}")


def sequence_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor | None = None,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    compute_entropy: bool = False,
    action_mask: Tensor | None = None,
    pack: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Token log-probs (and entropies) of `input_ids` under a HF causal LM, aligned with ids.

    Position t of the `[B, T]` outputs holds `log p(input_ids[t] | input_ids[<t])` (position 0
    holds 0). Only positions with a real context are scored: every non-padding position > 0,
    or, if `action_mask` is given, only its True positions (their hidden states are gathered
    first, so the head runs on policy tokens only). Unscored positions hold 0. `position_ids`
    default to `cumsum(attention_mask) - 1` (right padding). Outputs are float32 (float64 for
    float64 models); log-probs carry gradients into the model, entropies are detached.

    `pack=True` runs the decoder padding-free: the right-padded rows are concatenated into one
    row `[1, sum of lengths]` with their own position ids and boundaries, and the outputs are
    laid out as above. It must run where packed attention is exact: inside
    `frlab.model.packed_attention.packed_attention(model)` (sdpa/eager models; keep the
    backward inside it too) or with flash-attention varlen.
    """
    decoder, head = lm_parts(model)
    _check_sequence_inputs(input_ids, attention_mask, position_ids, action_mask)
    mask = attention_mask.bool()
    if position_ids is None:
        position_ids = (mask.long().cumsum(dim=1) - 1).clamp_min(0)
    if pack:
        hidden, rows = _packed_hidden(model, decoder, input_ids, mask, position_ids)
    else:
        out = decoder(
            input_ids=input_ids,
            attention_mask=mask.long(),
            position_ids=position_ids,
            use_cache=False,
        )
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        rows = None
    score = scored_positions(mask, action_mask)
    scored_hidden = hidden[:, :-1][score] if rows is None else hidden[rows[:, :-1][score]]
    logp, entropy = logprobs_from_hidden(
        scored_hidden,
        head.weight,
        input_ids[:, 1:][score],
        bias=head.bias,
        temperature=temperature,
        chunk_size=chunk_size,
        compute_entropy=compute_entropy,
    )
    log_probs = _scatter_aligned(logp, score)
    entropies = None if entropy is None else _scatter_aligned(entropy, score)
    return log_probs, entropies


def packed_index(attention_mask: Tensor) -> Tensor:
    """Long [B, T]: position of each real token in the packed row (row-major order); -1 on
    padding. Rows must be right-padded (a prefix of real tokens), else ValueError."""
    mask = attention_mask.bool()
    lengths = mask.sum(dim=1)
    columns = torch.arange(mask.shape[1], device=mask.device)
    if not torch.equal(mask, columns < lengths[:, None]) or bool((lengths == 0).any()):
        raise ValueError("pack=True needs right-padded rows with at least one real token each")
    flat = mask.flatten().long().cumsum(0).view(mask.shape) - 1
    return torch.where(mask, flat, -1)


def _packed_hidden(
    model: nn.Module, decoder: nn.Module, input_ids: Tensor, mask: Tensor, position_ids: Tensor
) -> tuple[Tensor, Tensor]:
    """Final hidden states `[N, H]` of the packed row, and `packed_index(mask)`."""
    from frlab.model.packed_attention import in_packed_mode

    if not in_packed_mode(model):
        raise ValueError(
            "pack=True outside frlab.model.packed_attention.packed_attention(model): the "
            f"{model.config._attn_implementation!r} attention would attend across trajectories"
        )
    rows = packed_index(mask)
    lengths = mask.sum(dim=1)
    bounds = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    longest = int(lengths.max())
    out = decoder(
        input_ids=input_ids[mask].unsqueeze(0),
        position_ids=position_ids[mask].unsqueeze(0),
        use_cache=False,
        cu_seq_lens_q=bounds,
        cu_seq_lens_k=bounds,
        max_length_q=longest,
        max_length_k=longest,
    )
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    return hidden[0], rows


def _scatter_aligned(values: Tensor, score: Tensor) -> Tensor:
    """Place per-scored-token values into [B, T] (column t+1 for score[:, t]); zeros elsewhere."""
    full = values.new_zeros(score.shape).masked_scatter(score, values)
    return F.pad(full, (1, 0))
