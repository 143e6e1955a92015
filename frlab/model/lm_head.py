"""The LM head's per-token log-probs, chunked: `[N, V]` logits are never materialised.

`logprobs_from_hidden(hidden, weight, targets)` pushes the final hidden states of the scored
positions through the LM head `chunk_size` rows at a time. A custom autograd Function keeps
only the hidden states, the head weight and a per-row log-sum-exp; backward recomputes each
chunk's logits and accumulates the gradients of the hidden states, the head weight and its
bias.

Numerics: the head matmul runs in the operands' dtype (or the active autocast dtype, as the
model's own forward would), the softmax in float32 (float64 for float64 models).

Speed and memory: a chunk's rows are capped by bytes sized to the device
(frlab.ops.logprobs.chunk_bytes: 64 MiB on a CPU, up to 256 MiB on a large GPU), and one chunk
is alive at a time. Where the device multiplies bfloat16/float16 operands straight into
float32 (CUDA's `aten::mm.dtype`, checked once per device against the plain product) the
forward holds one float32 chunk and the backward accumulates the head's float32 gradient in
place; elsewhere a low-precision product (half a chunk) sits beside its float32 copy (1.5
chunks), and the backward adds a `[V, H]` product per chunk into the float32 gradient.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from frlab.ops.logprobs import (
    check_chunking,
    check_targets,
    chunk_stats_,
    compute_dtype_for,
    rows_per_chunk,
    softmax_grad_,
)
from frlab.ops.phases import phase


def matmul_dtype(hidden: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype the head matmul would run in: the autocast dtype if active, else promoted."""
    promoted = torch.promote_types(hidden.dtype, weight.dtype)
    device_type = hidden.device.type
    if promoted != torch.float64 and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return promoted


LOW_PRECISION = (torch.bfloat16, torch.float16)
_FP32_PRODUCTS: dict[tuple[str, torch.dtype], bool] = {}


def fp32_products(device: torch.device, mm: torch.dtype) -> bool:
    """Whether `device` multiplies `mm` operands straight into float32 (`aten::mm.dtype`) and
    accumulates such a product in place (`aten::addmm.dtype_out`): CUDA with bf16/fp16 only,
    checked once per device and dtype against the plain float32 product."""
    if device.type != "cuda" or mm not in LOW_PRECISION:
        return False
    key = (str(device), mm)
    if key not in _FP32_PRODUCTS:
        _FP32_PRODUCTS[key] = _check_fp32_products(device, mm)
    return _FP32_PRODUCTS[key]


def _check_fp32_products(device: torch.device, mm: torch.dtype) -> bool:
    gen = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(n, 32, device=device, generator=gen).to(mm) for n in (24, 40))
    acc = torch.ones(32, 32, device=device)
    try:
        product = torch.ops.aten.mm.dtype(a, b.t(), torch.float32)
        torch.ops.aten.addmm.dtype_out(acc, a.t(), a, torch.float32, out=acc)
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return False
    want = a.float() @ b.float().t()
    want_acc = 1.0 + a.float().t() @ a.float()
    return (
        product.dtype == torch.float32
        and torch.allclose(product, want, rtol=1e-3, atol=1e-3)
        and torch.allclose(acc, want_acc, rtol=1e-3, atol=1e-3)
    )


def _head_chunk(
    h: Tensor, w: Tensor, b: Tensor | None, mm: torch.dtype, cdtype: torch.dtype, tau: float
) -> Tensor:
    """Fresh tempered logits of one row chunk: (h W^T + b) / tau in the compute dtype."""
    if cdtype == torch.float32 and fp32_products(h.device, mm):
        z = torch.ops.aten.mm.dtype(h.to(mm), w.t(), torch.float32)
        if b is not None:
            z += b
    else:
        z = F.linear(h.to(mm), w, b).to(cdtype)
    return z.div_(tau) if tau != 1.0 else z


def _accumulate_head_grad(grad_w: Tensor, g_mm: Tensor, h: Tensor, mm: torch.dtype) -> None:
    """grad_w [V, H] (compute dtype) += g^T h, summed in the compute dtype."""
    if grad_w.dtype == mm:
        grad_w.addmm_(g_mm.t(), h)  # no [V, H] temporary
    elif grad_w.dtype == torch.float32 and fp32_products(h.device, mm):
        torch.ops.aten.addmm.dtype_out(grad_w, g_mm.t(), h, torch.float32, out=grad_w)
    else:
        grad_w += g_mm.t() @ h  # low-precision matmul, summed in float32


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
        with torch.autocast(dev.type, enabled=False), phase("lm_head_forward"):
            w = weight.to(mm_dtype)
            b = None if bias is None else bias.to(mm_dtype)
            for s in range(0, n, chunk_size):
                e = min(s + chunk_size, n)
                z = _head_chunk(hidden[s:e], w, b, mm_dtype, cdtype, temperature)
                lp, ls, ent = chunk_stats_(z, targets[s:e], compute_entropy)
                logp[s:e], lse[s:e] = lp, ls
                if ent is not None:
                    entropy[s:e] = ent
                del z  # one chunk alive at a time
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
        with torch.autocast(hidden.device.type, enabled=False), phase("lm_head_backward"):
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
                if grad_w is not None:
                    _accumulate_head_grad(grad_w, g_mm, h, mm)
                if grad_b is not None:
                    grad_b += g.sum(dim=0)
                del z, g, g_mm  # one chunk alive at a time
        return (
            grad_h,
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            None,
            None,
            None,
            None,
            None,
        )


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
        raise ValueError(f"hidden must be a 2-D float [N, H] tensor, got {describe(hidden)}")
    if not isinstance(weight, Tensor) or weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"weight must be a 2-D float [V, H] tensor, got {describe(weight)}")
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
        hidden,
        weight,
        bias,
        targets,
        float(temperature),
        rows_per_chunk(chunk_size, weight.shape[0], hidden.device),
        bool(compute_entropy),
        mm,
    )
    return logp, (entropy if compute_entropy else None)


def describe(x: Any) -> str:
    if isinstance(x, Tensor):
        return f"{x.dtype} tensor of shape {list(x.shape)}"
    return type(x).__name__
