"""A progress bar for learner updates: step / max_steps with reward, acceptance and lag.

Lightning's default bar counts batches of an epoch, which for an endless rollout stream has
no total and restarts on resume. This one counts optimizer steps (`trainer.global_step`,
continuing after `ckpt_path=last`) against `trainer.max_steps` and shows the metrics that
tell whether FlashREINFORCE is healthy: mean reward, the trust region's acceptance rate and
the policy lag of the batch.

One bar: it is created already labelled `updates` with its total and the restored step (a
resumed run shows `N/max_steps`, not `N/?`; Lightning skips `on_train_epoch_start` when it
restarts mid-epoch), so Lightning's own `Training` bar never appears. Building the bar also
hides Lightning's advertising tips ("💡 Tip: ... litlogger / litmodels") from the console.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Any

from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

SHOWN = {
    "reward": "train/reward_mean",
    "acc": "train/acceptance_rate",
    "lag": "train/policy_lag_mean",
}


def short_metrics(metrics: dict[str, Any], step: int) -> dict[str, int | str]:
    """The bar's postfix: step plus the SHOWN metrics present in `metrics` (3 decimals)."""
    out: dict[str, int | str] = {"step": int(step)}
    for short, name in SHOWN.items():
        for key in (name, f"{name}_step"):
            if key in metrics:
                value = float(metrics[key])
                out[short] = f"{value:.3f}" if math.isfinite(value) else str(value)
                break
    return out


class _NoTips(logging.Filter):
    """Drops Lightning's advertising lines (they start with "💡 Tip:")."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


TIP_LOGGER = "lightning.pytorch.utilities.rank_zero"


def hide_lightning_tips() -> None:
    """Install the `_NoTips` filter on the logger Lightning's tips go through (idempotent)."""
    logger = logging.getLogger(TIP_LOGGER)
    if not any(isinstance(f, _NoTips) for f in logger.filters):
        logger.addFilter(_NoTips())


class ProgressBar(TQDMProgressBar):
    """TQDM bar over optimizer steps showing step, reward, acceptance and lag."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        hide_lightning_tips()

    def init_train_tqdm(self) -> Tqdm:
        """The bar, labelled and sized from the first draw (total max_steps, at global_step)."""
        trainer = self._trainer
        steps = getattr(trainer, "max_steps", -1) if trainer is not None else -1
        return Tqdm(
            desc="updates",
            total=steps if isinstance(steps, int) and steps > 0 else None,
            initial=int(getattr(trainer, "global_step", 0) or 0),
            position=2 * self.process_position,
            disable=self.is_disabled,
            leave=True,
            dynamic_ncols=True,
            file=sys.stdout,
            smoothing=0,
            bar_format=self.BAR_FORMAT,
        )

    def get_metrics(self, trainer: Any, pl_module: Any) -> dict[str, int | str]:  # type: ignore[override]
        return short_metrics(dict(trainer.callback_metrics), trainer.global_step)

    def on_train_epoch_start(self, trainer: Any, *_: Any) -> None:
        bar = self.train_progress_bar
        if bar is None or bar.disable:  # other ranks: a disabled bar has no state to set
            return
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        # Not bar.reset(): it draws 0/total once. Rate and ETA count this session's steps.
        bar.total = total
        bar.n = bar.initial = bar.last_print_n = trainer.global_step
        bar.start_t = bar.last_print_t = time.time()
        bar.set_description("updates", refresh=False)
        bar.refresh()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *_: Any) -> None:
        bar = self.train_progress_bar
        if bar is None or bar.disable:
            return
        step = trainer.global_step
        if step % self.refresh_rate == 0 or step == trainer.max_steps:
            bar.n = step
            bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
            bar.refresh()
