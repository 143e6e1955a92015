"""AdamW and the per-update learning-rate schedules of the learner.

The FlashREINFORCE paper trains with AdamW (lr 1e-6, weight decay 0.1, grad-norm clip 1.0) and
either a cosine schedule (linear warmup over `warmup_ratio * max_steps` updates, then cosine decay
to `min_lr_ratio * lr`) or a constant one (ALFWorld). A schedule advances once per optimizer
update, never per micro-batch, because the learner takes exactly one update per batch.

On CUDA, torch's AdamW (or Adam) is built fused (`fused=True`: one kernel per step instead of
foreach's several) unless the `optim` node sets `fused` or `foreach` itself; elsewhere it is
torch's default.

The schedule's length `max_steps` is `optim.schedule_steps` when set, else `trainer.max_steps`:
the paper presets keep the reference run's update count as the schedule (e.g. 3,944) and may
stop earlier at a headline step (`trainer.max_steps`, e.g. 600), exactly as a longer reference
run would have been at that step.

Schedule conventions (0-based update index `s`, `W = round(warmup_ratio * max_steps)` warmup
updates, `S = max_steps`), as a factor on the base lr:

- warmup (both schedules): `(s + 1) / W` for `s < W`, so the first update already moves the
  weights and update `W - 1` runs at the full lr;
- cosine after warmup: `m + (1 - m) * (1 + cos(pi * p)) / 2` with `m = min_lr_ratio` and
  `p = (s - W) / max(1, S - W - 1)` clamped to [0, 1]: the first post-warmup update runs at the
  full lr and the last update (`s = S - 1`) runs at exactly `min_lr_ratio * lr`;
- constant after warmup: 1.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from frlab.errors import ConfigError
from frlab.registry import Registry

SCHEDULES: Registry[type] = Registry("lr scheduler")


def check_schedule(optim: Mapping[str, Any], max_steps: int) -> None:
    """The run ends within its lr schedule: it may stop before the end, never run past it."""
    length = optim["schedule_steps"]
    if length is not None and length < max_steps:
        raise ConfigError(
            "optim.schedule_steps",
            f"({length}) is shorter than trainer.max_steps ({max_steps}): the run would continue "
            "past the end of its lr schedule; set optim.schedule_steps >= trainer.max_steps "
            "(null: the schedule spans trainer.max_steps)",
        )


FUSABLE = (torch.optim.AdamW, torch.optim.Adam)


def fused_where_offered(params: Iterable[Any]) -> dict[str, bool]:
    """`{"fused": True}` when every parameter is a floating-point CUDA tensor (torch's fused
    AdamW: one kernel per step instead of foreach's several), else `{}` (torch's default)."""
    params = list(params)
    if params and all(p.is_cuda and p.is_floating_point() for p in params):
        return {"fused": True}
    return {}


def make_optimizer(factory: Callable[..., Any], params: list[torch.nn.Parameter]) -> Any:
    """`factory(params)`, fused on CUDA when the factory is torch's AdamW or Adam and the
    `optim` node does not say otherwise."""
    target = getattr(factory, "func", factory)
    keywords = getattr(factory, "keywords", {})
    if target in FUSABLE and "fused" not in keywords and "foreach" not in keywords:
        return factory(params, **fused_where_offered(params))
    return factory(params)


@dataclass
class _Warmup(abc.ABC):
    """Shared warmup; subclasses give the factor after warmup. Picklable (LambdaLR state)."""

    warmup_steps: int

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        return self.after_warmup(step)

    @abc.abstractmethod
    def after_warmup(self, step: int) -> float:
        """The lr factor once warmup is over."""


@SCHEDULES.register("constant")
@dataclass
class ConstantFactor(_Warmup):
    """Full lr after an optional linear warmup."""

    def after_warmup(self, step: int) -> float:
        return 1.0


@SCHEDULES.register("cosine")
@dataclass
class CosineFactor(_Warmup):
    """Cosine decay from the full lr to `min_lr_ratio` of it at the last update."""

    max_steps: int
    min_lr_ratio: float

    def after_warmup(self, step: int) -> float:
        span = max(1, self.max_steps - self.warmup_steps - 1)
        progress = min(1.0, max(0.0, (step - self.warmup_steps) / span))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    scheduler: str,
    max_steps: int,
    warmup_ratio: float,
    min_lr_ratio: float,
) -> LambdaLR:
    """A per-update LambdaLR for `scheduler` in {"cosine", "constant"} over `max_steps`
    updates (see the module docstring); the `optim` keys as declared and checked."""
    kind = SCHEDULES.get(str(scheduler), key="optim.scheduler")
    warmup_steps = int(round(warmup_ratio * max_steps))
    if kind is CosineFactor:
        factor = CosineFactor(warmup_steps, max_steps=max_steps, min_lr_ratio=min_lr_ratio)
    else:
        factor = ConstantFactor(warmup_steps)
    return LambdaLR(optimizer, factor)
