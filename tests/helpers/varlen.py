"""A CPU kernel for the two ATen ops PyTorch's varlen attention calls, so that torch's own
`torch.nn.attention.varlen.varlen_attn` (its argument checks, its custom op, the autograd it
registers) runs on a CPU; only the CUDA FlashAttention-2 kernel is replaced.

The kernel follows the ops' schemas (`aten::_flash_attention_forward` /
`_flash_attention_backward`, printed by torch) and FlashAttention-2's varlen contract:
`query [Tq, Hq, d]`, `key/value [Tk, Hkv, d]` with Hq a multiple of Hkv (query head h reads
K/V head h // (Hq / Hkv)), boundaries `cum_seq_q/k`, causal where `is_causal` or a right
window of 0; outputs `out [Tq, Hq, d]` in the query's dtype, `logsumexp [Hq, Tq]` float32 (the
shape of torch's own fake for the op), an rng state. Math in float64 for float64 inputs,
else float32. Backward is the standard attention gradient, its probabilities recomputed in
the math dtype (the saved log-sum-exp is float32, as FlashAttention-2 keeps it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor


def _segments(cum: Tensor) -> list[tuple[int, int]]:
    cuts = [int(c) for c in cum.tolist()]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def _probs(q: Tensor, k: Tensor, scale: float, causal: bool) -> tuple[Tensor, Tensor]:
    """(probabilities [H, n, n], log-sum-exp [H, n]) of one segment's scores."""
    scores = q.transpose(0, 1) @ k.permute(1, 2, 0) * scale  # [H, n, n]
    if causal:
        n = scores.shape[-1]
        blocked = torch.ones(n, n, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(blocked, float("-inf"))
    lse = scores.logsumexp(-1)
    return (scores - lse[..., None]).exp(), lse


def _grouped(t: Tensor, heads: int) -> Tensor:
    return t.repeat_interleave(heads // t.shape[1], dim=1)


def _math(t: Tensor) -> Tensor:
    return t.to(torch.float64 if t.dtype == torch.float64 else torch.float32)


def cpu_flash_forward(
    query,
    key,
    value,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    return_debug_mask,
    *,
    scale=None,
    window_size_left=None,
    window_size_right=None,
    seqused_k=None,
    alibi_slopes=None,
    block_table=None,
    num_splits=None,
):  # noqa: ANN001, ANN201
    """aten::_flash_attention_forward on a CPU (varlen layout only)."""
    assert cum_seq_q is not None and torch.equal(cum_seq_q, cum_seq_k)
    assert dropout_p == 0.0 and seqused_k is None and block_table is None
    assert window_size_left in (None, -1) and alibi_slopes is None
    if not query.dtype == key.dtype == value.dtype:  # FlashAttention-2 checks the same
        raise RuntimeError("query and key must have the same dtype")
    causal = bool(is_causal) or window_size_right == 0
    heads, scale = query.shape[1], scale or query.shape[-1] ** -0.5
    out = torch.empty_like(query)
    lse = torch.empty(heads, query.shape[0], dtype=torch.float32)
    for s, e in _segments(cum_seq_q):
        q, k, v = _math(query[s:e]), _grouped(_math(key[s:e]), heads), _math(value[s:e])
        p, seg_lse = _probs(q, k, scale, causal)
        out[s:e] = (p @ _grouped(v, heads).transpose(0, 1)).transpose(0, 1).to(query.dtype)
        lse[:, s:e] = seg_lse.float()
    rng = torch.zeros(2, dtype=torch.uint64)
    return out, lse, rng, torch.empty(0), torch.empty(0)


def cpu_flash_backward(
    grad_out,
    query,
    key,
    value,
    out,
    logsumexp,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    rng_state,
    unused,
    *,
    scale=None,
    window_size_left=None,
    window_size_right=None,
):  # noqa: ANN001, ANN201
    """aten::_flash_attention_backward on a CPU: (dq, dk, dv), dk/dv summed over groups."""
    causal = bool(is_causal) or window_size_right == 0
    heads, kv_heads = query.shape[1], key.shape[1]
    scale = scale or query.shape[-1] ** -0.5
    dq, dk, dv = (torch.zeros_like(t, dtype=_math(t).dtype) for t in (query, key, value))
    for s, e in _segments(cum_seq_q):
        q, k, v = _math(query[s:e]), _grouped(_math(key[s:e]), heads), _math(value[s:e])
        v = _grouped(v, heads)
        do, o = _math(grad_out[s:e]).transpose(0, 1), _math(out[s:e]).transpose(0, 1)
        p, _ = _probs(q, k, scale, causal)  # [H, n, n], recomputed in the math dtype
        dv_h = p.transpose(1, 2) @ do  # [H, n, d]
        dp = do @ v.permute(1, 2, 0)  # [H, n, n]
        ds = p * (dp - (do * o).sum(-1, keepdim=True))
        dq[s:e] = (ds @ k.transpose(0, 1) * scale).transpose(0, 1)
        dk_h = ds.transpose(1, 2) @ q.transpose(0, 1) * scale
        group = heads // kv_heads
        dk[s:e] = dk_h.view(kv_heads, group, e - s, -1).sum(1).transpose(0, 1)
        dv[s:e] = dv_h.view(kv_heads, group, e - s, -1).sum(1).transpose(0, 1)
    return dq.to(query.dtype), dk.to(key.dtype), dv.to(value.dtype)


@contextlib.contextmanager
def cpu_flash_kernels() -> Iterator[None]:
    """Register the CPU kernels for the block (removed after it)."""
    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl("_flash_attention_forward", cpu_flash_forward, "CPU")
        lib.impl("_flash_attention_backward", cpu_flash_backward, "CPU")
        yield
    finally:
        lib._destroy()
