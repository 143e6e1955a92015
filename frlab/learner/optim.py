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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from frlab.registry import Registry, close_matches

# Keys of the `optim` config node that are not optimizer arguments (read elsewhere).
SCHEDULE_KEYS = ("scheduler", "warmup_ratio", "min_lr_ratio", "schedule_steps")
LEARNER_KEYS = ("grad_clip", "skip_zero_signal_steps")
ADAMW_KEYS = ("lr", "weight_decay", "betas", "eps")

SCHEDULES: Registry[type] = Registry("lr scheduler")

# What an `optim` key a Python caller leaves out means: the config schema's own default
# (frlab.config.schema.OptimConfig; a test compares the two), so the Python API and the
# command line train alike.
OPTIM_DEFAULTS: dict[str, Any] = {
    "weight_decay": 0.1, "betas": (0.9, 0.999), "eps": 1e-8, "grad_clip": 1.0,
    "scheduler": "cosine", "warmup_ratio": 0.0, "min_lr_ratio": 0.0, "schedule_steps": None,
    "skip_zero_signal_steps": False,
}  # fmt: skip


def with_defaults(optim: Mapping[str, Any]) -> dict[str, Any]:
    """The `optim` node with every key it leaves out at its schema default."""
    return {**OPTIM_DEFAULTS, **optim}


def check_schedule(optim: Mapping[str, Any], max_steps: int) -> None:
    """The run ends within its lr schedule: it may stop before the end, never run past it
    (ValueError, its text starting with the key)."""
    length = optim.get("schedule_steps")
    if length is not None and length < max_steps:
        raise ValueError(f"optim.schedule_steps ({length}) is shorter than trainer.max_steps "
                         f"({max_steps}): the run would continue past the end of its lr "
                         "schedule; set optim.schedule_steps >= trainer.max_steps (null: the "
                         "schedule spans trainer.max_steps)")  # fmt: skip


def _check_unknown(extra: dict[str, Any]) -> None:
    """Raise for keys of `optim` nobody reads, suggesting the closest known key."""
    if not extra:
        return
    known = [*ADAMW_KEYS, *SCHEDULE_KEYS, *LEARNER_KEYS]
    bad = sorted(extra)
    hints = {k: close_matches(k, known) for k in bad}
    text = "; ".join(
        f"optim.{k}" + (f" (did you mean {' or '.join(map(repr, h))}?)" if h else "")
        for k, h in hints.items()
    )
    raise ValueError(f"unknown optimizer config key(s): {text}; known: {', '.join(known)}")


def _finite_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(float(value)):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def grad_clip_norm(grad_clip: Any) -> float:
    """`optim.grad_clip` as a max norm; None or 0 disables clipping (returns inf)."""
    if grad_clip is None:
        return math.inf
    value = _finite_number("optim.grad_clip", grad_clip)
    if value < 0:
        raise ValueError(f"optim.grad_clip must be >= 0 (0 disables clipping), got {grad_clip!r}")
    return math.inf if value == 0 else value


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


def build_optimizer(
    params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]],
    *,
    lr: float,
    weight_decay: float = OPTIM_DEFAULTS["weight_decay"],
    betas: Sequence[float] = OPTIM_DEFAULTS["betas"],
    eps: float = OPTIM_DEFAULTS["eps"],
    **rest: Any,
) -> torch.optim.AdamW:
    """AdamW over `params` from the `optim` config node (schedule keys and grad_clip ignored),
    fused on CUDA."""
    _check_unknown({k: v for k, v in rest.items() if k not in SCHEDULE_KEYS + LEARNER_KEYS})
    lr = _finite_number("optim.lr", lr)
    if lr <= 0:
        raise ValueError(f"optim.lr must be > 0, got {lr!r}")
    weight_decay = _finite_number("optim.weight_decay", weight_decay)
    if weight_decay < 0:
        raise ValueError(f"optim.weight_decay must be >= 0, got {weight_decay!r}")
    betas = tuple(betas)
    if len(betas) != 2 or not all(0.0 <= _finite_number("optim.betas", b) < 1.0 for b in betas):
        raise ValueError(f"optim.betas must be two numbers in [0, 1), got {list(betas)!r}")
    eps = _finite_number("optim.eps", eps)
    if eps <= 0:
        raise ValueError(f"optim.eps must be > 0, got {eps!r}")
    params = list(params)
    flat = [
        p for group in params for p in (group["params"] if isinstance(group, dict) else [group])
    ]
    return torch.optim.AdamW(
        params, lr=lr, weight_decay=weight_decay, betas=(float(betas[0]), float(betas[1])),
        eps=eps, **fused_where_offered(flat),
    )  # fmt: skip


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

    max_steps: int = 1
    min_lr_ratio: float = 0.0

    def after_warmup(self, step: int) -> float:
        span = max(1, self.max_steps - self.warmup_steps - 1)
        progress = min(1.0, max(0.0, (step - self.warmup_steps) / span))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine


def _ratio(name: str, value: Any, *, upper_open: bool) -> float:
    value = _finite_number(name, value)
    ok = 0.0 <= value < 1.0 if upper_open else 0.0 <= value <= 1.0
    if not ok:
        bound = "[0, 1)" if upper_open else "[0, 1]"
        raise ValueError(f"{name} must be in {bound}, got {value!r}")
    return value


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    scheduler: str,
    max_steps: int | None,
    warmup_ratio: float = OPTIM_DEFAULTS["warmup_ratio"],
    min_lr_ratio: float = OPTIM_DEFAULTS["min_lr_ratio"],
) -> LambdaLR:
    """A per-update LambdaLR for `scheduler` in {"cosine", "constant"} (see module docstring)."""
    kind = SCHEDULES.get(str(scheduler), key="optim.scheduler")
    warmup_ratio = _ratio("optim.warmup_ratio", warmup_ratio, upper_open=True)
    min_lr_ratio = _ratio("optim.min_lr_ratio", min_lr_ratio, upper_open=False)
    needs_horizon = scheduler == "cosine" or warmup_ratio > 0
    if max_steps is None:
        if needs_horizon:
            raise ValueError(
                f"optim.scheduler={scheduler!r} with warmup_ratio={warmup_ratio} needs max_steps "
                "(trainer.max_steps), got None"
            )
        return LambdaLR(optimizer, ConstantFactor(warmup_steps=0))
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps (trainer.max_steps) must be a positive int, got {max_steps!r}")
    warmup_steps = int(round(warmup_ratio * max_steps))
    if kind is CosineFactor:
        factor = CosineFactor(warmup_steps, max_steps=max_steps, min_lr_ratio=min_lr_ratio)
    else:
        factor = ConstantFactor(warmup_steps)
    return LambdaLR(optimizer, factor)
