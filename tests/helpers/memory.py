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


class LiveBytes(TorchDispatchMode):
    """Peak bytes of the tensors ATen ops create, alive at once, counted from block entry.

    Each fresh storage an op returns is counted until it is freed (a finalizer on the storage:
    torch keeps one Python object per storage, so it fires when the last view dies), which is
    what `torch.cuda.max_memory_allocated` counts on a GPU, measured on any device.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def _freed(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self._seen.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        import weakref

        out = func(*args, **(kwargs or {}))
        inputs = {
            a.untyped_storage().data_ptr()
            for a in tree_leaves((args, kwargs))
            if isinstance(a, torch.Tensor)
        }
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key in self._seen or key in inputs or storage.nbytes() == 0:
                continue
            self._seen.add(key)
            self.live += storage.nbytes()
            weakref.finalize(storage, self._freed, key, storage.nbytes())
        self.peak = max(self.peak, self.live)
        return out
