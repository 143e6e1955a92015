"""A progress bar for learner updates: step / max_steps with reward, acceptance and lag.

Lightning's default bar counts batches of an epoch, which for an endless rollout stream has
no total and restarts on resume. This one counts optimizer steps (`trainer.global_step`,
continuing after `ckpt_path=last`) against `trainer.max_steps` and shows the metrics that
tell whether FlashREINFORCE is healthy: mean reward, the trust region's acceptance rate and
the policy lag of the batch.
"""

from __future__ import annotations

import math
from typing import Any

from lightning.pytorch.callbacks import TQDMProgressBar

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


class ProgressBar(TQDMProgressBar):
    """TQDM bar over optimizer steps showing step, reward, acceptance and lag."""

    def get_metrics(self, trainer: Any, pl_module: Any) -> dict[str, int | str]:  # type: ignore[override]
        return short_metrics(dict(trainer.callback_metrics), trainer.global_step)

    def on_train_epoch_start(self, trainer: Any, *_: Any) -> None:
        bar = self.train_progress_bar
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        bar.reset(total=total)
        bar.initial = 0
        bar.n = trainer.global_step
        bar.set_description("updates")
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
