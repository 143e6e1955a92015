"""Wall time per phase of a learner update, for profiling (bench/gpu_mfu.py); off by default.

`profiling()` turns it on for a block and yields a `Phases` tally. `phase(name)` times its block
with the device synchronised at both ends, so the GPU work it launched is counted where it
ran; `time_backward(name, output, inputs)` times the backward between `output`'s gradient and
the first input's (hooks). The learner marks: `decoder_forward` (its `attention_forward` inside),
`lm_head_forward`, `objective`, `backward` (its `lm_head_backward` and `attention_backward`
inside) and `optimizer`. Off, `phase` costs one global read; synchronising changes the
overlap the update would have, so profile an update of its own, never a timed one.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class Phases:
    """Seconds and calls per phase name, synchronising `device` at each boundary."""

    device: torch.device
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    _open: dict[str, float] = field(default_factory=dict)

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def start(self, name: str) -> None:
        self._open[name] = self.now()

    def stop(self, name: str) -> None:
        began = self._open.pop(name, None)
        if began is not None:
            self.seconds[name] += self.now() - began
            self.calls[name] += 1


_ACTIVE: Phases | None = None


@contextlib.contextmanager
def profiling(device: torch.device | str) -> Iterator[Phases]:
    """Record phases for the block (one tally at a time)."""
    global _ACTIVE
    if _ACTIVE is not None:
        raise RuntimeError("profiling() is already on")
    _ACTIVE = Phases(torch.device(device))
    try:
        yield _ACTIVE
    finally:
        _ACTIVE = None


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the block as `name` while profiling (nothing otherwise)."""
    tally = _ACTIVE
    if tally is None:
        yield
        return
    tally.start(name)
    try:
        yield
    finally:
        tally.stop(name)


def time_backward(name: str, output: Tensor, inputs: Sequence[Tensor]) -> None:
    """While profiling: time the backward from `output`'s gradient to the first gradient of
    `inputs` (the op between them, e.g. attention)."""
    tally = _ACTIVE
    if tally is None or not output.requires_grad:
        return
    live = [t for t in inputs if t.requires_grad]
    if not live:
        return
    output.register_hook(lambda grad: tally.start(name))
    for t in live:
        t.register_hook(lambda grad: tally.stop(name))
