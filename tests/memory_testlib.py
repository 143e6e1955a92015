"""Allocation recording shared by the log-prob memory tests (objective and model)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class AllocationRecorder(TorchDispatchMode):
    """Records (op, dtype, numel) of every tensor an ATen op returns in fresh memory."""

    def __init__(self) -> None:
        super().__init__()
        self.allocs: list[tuple[str, torch.dtype, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        inputs = {
            a.untyped_storage().data_ptr()
            for a in tree_leaves((args, kwargs))
            if isinstance(a, torch.Tensor)
        }
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.allocs.append((str(func), t.dtype, t.numel()))
        return out
