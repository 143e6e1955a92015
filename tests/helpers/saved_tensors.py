"""What autograd saves for backward (shared by the LM-head and sequence log-prob tests)."""

from __future__ import annotations

import torch


def record_saved(fn):  # type: ignore[no-untyped-def]
    """Run fn() and return (its result, the numel of every tensor autograd saved)."""
    sizes: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sizes
