"""PyTorch's variable-length attention, feature-detected on the installed torch.

`torch.nn.attention.varlen.varlen_attn` (torch >= 2.10) runs FlashAttention-2 (bundled with
PyTorch's CUDA builds: no flash-attn package) over packed sequences laid out `[N, heads, d]`
with boundaries `cu_seq` (int32, `[0, n_1, n_1 + n_2, ..., N]`) and the longest length: one
call attends within each sequence only. Its releases differ, so nothing is assumed:

- causality is `window_size=(-1, 0)` in releases that have a window, `is_causal=True` in
  those that have that flag instead (read from the signature);
- grouped-query heads go through `enable_gqa=True` where the signature has it, else K/V are
  repeated once per group (what the kernel would do, at the cost of the copy).

`varlen_available` says why the kernel cannot run for a model here ('' when it can): it needs a
CUDA device of compute capability 8.0 or newer (not ROCm), bfloat16 or float16, a head
dimension of at most 256 that is a multiple of 8, and the kernel must pass a check on this
device (two small packed sequences against per-sequence sdpa, run once per device and dtype).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

MIN_CAPABILITY = (8, 0)  # FlashAttention-2: Ampere or newer
MAX_HEAD_DIM = 256
DTYPES = (torch.bfloat16, torch.float16)


def varlen_kernel() -> Callable[..., Tensor] | None:
    """torch.nn.attention.varlen.varlen_attn, or None where this torch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


@functools.cache
def _parameters(kernel: Callable[..., Any]) -> frozenset[str]:
    return frozenset(inspect.signature(kernel).parameters)


def causal_options(kernel: Callable[..., Any]) -> dict[str, Any] | None:
    """The keyword arguments that make `kernel` causal, or None if it has no such option."""
    params = _parameters(kernel)
    if "window_size" in params:
        return {"window_size": (-1, 0)}
    if "is_causal" in params:
        return {"is_causal": True}
    return None


def takes_gqa(kernel: Callable[..., Any]) -> bool:
    """Whether `kernel` shares each K/V head with a group of query heads itself."""
    return "enable_gqa" in _parameters(kernel)


def head_dim_of(config: Any) -> int:
    """The attention head dimension of a transformers config."""
    from frlab.model.memory_plan import text_config

    text = text_config(config)
    return int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)


def varlen_available(device: torch.device, dtype: torch.dtype, config: Any) -> str:
    """'' when the varlen kernel runs for a model of `config` on `device` in `dtype`, else why
    it does not (a short phrase)."""
    if device.type != "cuda" or torch.version.hip:
        return f"{device.type} device (the varlen kernel is CUDA-only)"
    if dtype not in DTYPES:
        return f"{str(dtype).removeprefix('torch.')} (the varlen kernel takes bfloat16/float16)"
    kernel = varlen_kernel()
    if kernel is None:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen"
    if causal_options(kernel) is None:
        return f"torch {torch.__version__}'s varlen_attn has no causal option"
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        return f"compute capability {capability[0]}.{capability[1]} (the kernel needs 8.0+)"
    head_dim = head_dim_of(config)
    if head_dim > MAX_HEAD_DIM or head_dim % 8:
        return f"head dimension {head_dim} (the kernel takes multiples of 8 up to 256)"
    return kernel_check(device, dtype)


_CHECKED: dict[tuple[str, torch.dtype], str] = {}


def kernel_check(device: torch.device, dtype: torch.dtype) -> str:
    """'' when the varlen kernel, called once here on two small packed sequences (grouped
    heads, forward and backward), equals per-sequence sdpa; else what went wrong. Cached per
    device and dtype: a kernel that fails on this GPU or torch is never chosen."""
    key = (str(device), dtype)
    if key not in _CHECKED:
        try:
            with torch.autocast(device.type, enabled=False):  # its own dtype, whatever is active
                _CHECKED[key] = _check_against_sdpa(device, dtype)
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
            _CHECKED[key] = f"varlen_attn failed its check here ({type(exc).__name__}: {exc})"
    return _CHECKED[key]


def _check_against_sdpa(device: torch.device, dtype: torch.dtype) -> str:
    gen = torch.Generator(device=device).manual_seed(0)
    lengths, heads, kv_heads, dim = (5, 11), 4, 2, 64
    q = torch.randn(heads, sum(lengths), dim, device=device, generator=gen).to(dtype)
    k, v = (
        torch.randn(kv_heads, sum(lengths), dim, device=device, generator=gen).to(dtype)
        for _ in range(2)
    )
    q.requires_grad_()
    cu_seq = torch.tensor([0, lengths[0], sum(lengths)], dtype=torch.int32, device=device)
    out = varlen_packed_attention(q, k, v, cu_seq, max(lengths), None)
    (grad,) = torch.autograd.grad(out.float().square().sum(), q)
    want = torch.cat(
        [
            torch.nn.functional.scaled_dot_product_attention(
                q[:, a:b].float().detach().requires_grad_(),
                k[:, a:b].float(),
                v[:, a:b].float(),
                is_causal=True,
                enable_gqa=True,
            ).transpose(0, 1)
            for a, b in ((0, lengths[0]), (lengths[0], sum(lengths)))
        ]
    )
    if not torch.allclose(out.float(), want, atol=3e-2, rtol=3e-2):
        return "varlen_attn disagreed with sdpa in its check here"
    if not bool(torch.isfinite(grad).all()):
        return "varlen_attn's backward gave non-finite gradients in its check here"
    return ""


def varlen_packed_attention(
    query: Tensor, key: Tensor, value: Tensor, cu_seq: Tensor, longest: int, scale: float | None
) -> Tensor:
    """Causal attention within each packed sequence: `query` `[Hq, N, d]`, `key`/`value`
    `[Hkv, N, d]` -> `[N, Hq, d]`, in one kernel call and without a host synchronisation."""
    kernel = varlen_kernel()
    options = causal_options(kernel) if kernel is not None else None
    if kernel is None or options is None:
        raise RuntimeError(f"torch {torch.__version__} has no causal varlen_attn")
    # One dtype for the three: under autocast the rotary embedding leaves q and k in float32
    # beside a bf16 v (torch's own sdpa is cast by autocast; this op is not).
    kind = query.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else value.dtype
    q, k, v = (t.transpose(0, 1).to(dtype) for t in (query, key, value))  # [N, heads, d]
    groups = q.shape[1] // k.shape[1]
    if groups > 1 and takes_gqa(kernel):
        options = {**options, "enable_gqa": True}
    elif groups > 1:
        k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
    return kernel(q, k, v, cu_seq, cu_seq, longest, longest, scale=scale, **options)
