"""Attention over packed rows: several trajectories in one row, none attending to another.

A packed forward feeds the decoder one row `[1, N]` that concatenates trajectories, with
per-trajectory `position_ids` (each restarts at 0, so rotary embeddings are those of the padded
layout) and `cu_seq_lens_q/k` + `max_length_q/k` (the trajectory boundaries, transformers'
`FlashAttentionKwargs`, passed through every decoder layer to the attention function).

What transformers 5.x does with such a row (read from `masking_utils` and
`modeling_flash_attention_utils`, 5.24):
- `flash_attention_2/3`: varlen kernels over `cu_seq_lens` (or boundaries inferred from
  `position_ids` when batch size is 1): exact and padding-free.
- `sdpa`, `eager`, `flex_attention`: with `attention_mask=None` and no cache,
  `find_packed_sequence_indices` detects where `position_ids` do not step by 1 and the mask
  becomes block-diagonal causal. Exact, but it is a dense `[N, N]` mask: attention costs N^2
  for the whole row (a padded row of width w costs w^2), which on a CPU costs more than the
  padding it removes (measured: `bench/learner.py`).

So for `sdpa` and `eager` models, `packed_attention(model)` swaps in one of two kernels for
the duration of the learner's forward AND backward (gradient checkpointing recomputes the
forward inside the backward); each sees exactly the keys a trajectory would see alone, costs
the sum of the squared lengths and builds no mask:

- `varlen` (`PACKED_VARLEN`): on CUDA in bfloat16/float16, one
  `torch.nn.attention.varlen.varlen_attn` call per layer over the whole packed row (PyTorch's
  bundled FlashAttention-2 kernel, no flash-attn package), causal, boundaries and longest
  length built once per micro-batch, no host synchronisation inside the layers; grouped-query
  heads through `enable_gqa` where the installed torch has it, else K/V repeated per group;
- `sdpa` (`PACKED_SDPA`): `scaled_dot_product_attention`, causal, once per trajectory
  (transformers' own `sdpa_attention_forward`; trajectories of equal length share one
  batched call): CPUs, float32/float64, and GPUs or torch builds the kernel does not take.

`packed_kernel` chooses (`auto`: varlen wherever it runs, the reason named otherwise; the dry
run prints the choice). Flash-attention models are left as they are (their varlen path already
does this); any other implementation is refused, and so are sliding-window and soft-capped
attention.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from frlab.errors import ConfigError
from frlab.model import varlen
from frlab.ops.phases import phase, time_backward

PACKED_SDPA = "frlab_packed_sdpa"
PACKED_VARLEN = "frlab_packed_varlen"
KERNELS = {"varlen": PACKED_VARLEN, "sdpa": PACKED_SDPA}
# Implementations whose packed forward is exact: swapped to a packed kernel, or native varlen.
SEGMENTED = ("sdpa", "eager")
NATIVE_VARLEN = ("flash_attention_2", "flash_attention_3")
SUPPORTED = (*SEGMENTED, *NATIVE_VARLEN)


def packed_sdpa_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Causal sdpa per trajectory of a packed row; `query/key/value` are `[1, heads, N, d]`.

    Needs `cu_seq_lens_q` (boundaries `[0, n_1, n_1 + n_2, ..., N]`); refuses a padding mask,
    a batch of several rows, a KV cache, a sliding window and logit soft-capping.
    """
    bounds = check_packed_call(PACKED_SDPA, module, query, key, attention_mask, kwargs)
    cuts = [int(b) for b in bounds.tolist()]
    if (
        cuts[0] != 0
        or cuts[-1] != query.shape[2]
        or any(a >= b for a, b in zip(cuts[:-1], cuts[1:], strict=True))
    ):
        raise ValueError(f"cu_seq_lens_q {cuts} does not partition {query.shape[2]} positions")
    lengths = [end - start for start, end in zip(cuts[:-1], cuts[1:], strict=True)]
    with phase("attention_forward"):
        out = _per_trajectory(module, query, key, value, lengths, dropout, scaling)
    time_backward("attention_backward", out, (query, key, value))
    return out.unsqueeze(0), None


def _per_trajectory(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    lengths: list[int],
    dropout: float,
    scaling: float | None,
) -> Tensor:
    """`[N, heads, d]`: causal sdpa per trajectory of the given lengths."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    # One split per tensor (its backward is one concatenation, not one full-size copy per
    # slice); trajectories of equal length share one batched call; one cat back in order.
    parts = [t.split(lengths, dim=2) for t in (query, key, value)]
    by_length: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        by_length.setdefault(n, []).append(i)
    outputs: list[Tensor] = [query] * len(lengths)  # placeholders, all replaced below
    for members in by_length.values():
        q, k, v = (torch.cat([p[i] for i in members]) for p in parts)
        out = sdpa_attention_forward(
            module, q, k, v, None, dropout=dropout, scaling=scaling, is_causal=True
        )[0]  # [len(members), n, heads, d]
        for i, piece in zip(members, out.unbind(0), strict=True):
            outputs[i] = piece
    return torch.cat(outputs)


def check_packed_call(
    name: str, module: nn.Module, query: Tensor, key: Tensor, mask: Any, kwargs: dict
) -> Tensor:
    """`cu_seq_lens_q` of a call a packed kernel can make exact, else ValueError: one packed
    row, no padding mask, no KV cache, no sliding window, no logit soft-capping."""
    bounds = kwargs.get("cu_seq_lens_q")
    if bounds is None:
        raise ValueError(
            f"{name} attention needs cu_seq_lens_q (a packed forward from "
            "frlab.model.lm_logprobs.sequence_logprobs(pack=True))"
        )
    if mask is not None or query.shape[0] != 1 or key.shape[2] != query.shape[2]:
        raise ValueError(f"{name} attention takes one packed row without padding mask or cache")
    for option in ("sliding_window", "softcap"):
        if kwargs.get(option) is not None or getattr(module, option, None) is not None:
            raise ValueError(
                f"packed sequences with {option} attention need flash_attention_2 "
                "(or data.pack_sequences=false)"
            )
    return bounds


def packed_varlen_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """One causal varlen call over a packed row; `query/key/value` are `[1, heads, N, d]`,
    the boundaries `cu_seq_lens_q` (int32, on the device) and `max_length_q` (an int)."""
    bounds = check_packed_call(PACKED_VARLEN, module, query, key, attention_mask, kwargs)
    if dropout and module.training:
        raise ValueError(f"{PACKED_VARLEN} attention has no dropout (got {dropout})")
    longest = kwargs.get("max_length_q")
    if not isinstance(longest, int):
        raise ValueError(f"{PACKED_VARLEN} attention needs max_length_q as an int")
    with phase("attention_forward"):
        out = varlen.varlen_packed_attention(query[0], key[0], value[0], bounds, longest, scaling)
    time_backward("attention_backward", out, (query, key, value))
    return out.unsqueeze(0), None  # [1, N, heads, d], as transformers' kernels return


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED_SDPA, packed_sdpa_attention)
    AttentionInterface.register(PACKED_VARLEN, packed_varlen_attention)


def effective_dtype(model: nn.Module) -> torch.dtype:
    """The dtype attention runs in: the active autocast dtype, else the model's parameters'."""
    param = next(model.parameters())
    kind = param.device.type
    if param.dtype != torch.float64 and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return param.dtype


def packed_kernel(model: nn.Module, kernel: str = "auto") -> tuple[str, str]:
    """(`varlen` or `sdpa`, why) for packed rows of `model` on its device and dtype now;
    `kernel` forces one (`varlen` where it cannot run is a ValueError naming why)."""
    if kernel not in ("auto", *KERNELS):
        raise ValueError(f"packed attention kernel must be auto, varlen or sdpa, got {kernel!r}")
    device = next(model.parameters()).device
    why_not = varlen.varlen_available(device, effective_dtype(model), model.config)
    if kernel == "varlen" and why_not:
        raise ValueError(f"packed varlen attention cannot run here: {why_not}")
    if kernel == "sdpa" or (kernel == "auto" and why_not):
        return "sdpa", why_not or "asked for"
    return "varlen", "torch varlen_attn, one call per layer"


def check_packable(model: nn.Module) -> str:
    """The model's attention implementation if packed forwards are exact for it, else ValueError."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl in KERNELS.values() or impl in SUPPORTED:
        return str(impl)
    raise ConfigError(
        "data.pack_sequences",
        f"data.pack_sequences=true needs attention (model.attn_implementation) in "
        f"{', '.join(SUPPORTED)}; the policy uses {impl!r}: set data.pack_sequences=false",
    )


@contextlib.contextmanager
def packed_attention(model: nn.Module, kernel: str = "auto") -> Iterator[None]:
    """Run `model`'s attention per trajectory of packed rows inside the block (see module doc),
    with the kernel `packed_kernel(model, kernel)` chooses.

    Hold it across the backward too when activation checkpointing recomputes the forward.
    """
    impl = check_packable(model)
    if impl not in SEGMENTED:
        yield
        return
    _register()
    config = model.config
    config._attn_implementation = KERNELS[packed_kernel(model, kernel)[0]]
    try:
        yield
    finally:
        config._attn_implementation = impl


def in_packed_mode(model: nn.Module) -> bool:
    """Whether a packed forward of `model` is exact now (inside `packed_attention`, or varlen)."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return impl in KERNELS.values() or impl in NATIVE_VARLEN
