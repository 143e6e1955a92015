"""`StepLog`: a step's scalar metrics, sent where `self.log(on_step=True, on_epoch=False)` sends
them, without its per-call cost.

Lightning 2.6's `LightningModule.log` walks its result collection on every call (about 0.3 ms
a call on this project's 2-core CPU machine, `logger=False`); the learner logs ~30 scalars per
optimizer step and the rollout callback ~10 more, which on a small model cost as much as the
backward pass. `StepLog` gives them Lightning's destinations directly:

- `trainer.callback_metrics` at once, as 0-d tensors (checkpoint monitors, frlab's metrics.csv
  and progress line read it in `on_train_batch_end`), and `trainer.logged_metrics`, which
  Lightning fills with the latest values whether or not a logger wrote them;
- `trainer.progress_bar_metrics` for the progress-bar names, as floats;
- every configured logger, at the step and under the condition Lightning uses for on-step
  metrics (`log_every_n_steps`, a stop request, `fast_dev_run`), when the module's
  `on_train_batch_end` calls `flush` (after the callbacks' hooks, as Lightning does).

Values are rank-local, as with `self.log(sync_dist=False)`; loggers write on rank 0 only.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import torch


class StepLog:
    """Scalars of the current optimizer step, published at once and flushed to the loggers."""

    def __init__(self) -> None:
        self.pending: dict[str, torch.Tensor] = {}

    def add(
        self, trainer: Any, values: Mapping[str, float], prog_bar: Collection[str] = ()
    ) -> None:
        """Publish `values` to the trainer's callback and progress-bar metrics; keep them for
        the loggers until `flush`."""
        if trainer is None:  # a module used outside a Trainer logs nowhere (as `self.log`)
            return
        tensors = {name: torch.tensor(float(value)) for name, value in values.items()}
        trainer.callback_metrics.update(tensors)
        trainer.logged_metrics.update(tensors)  # Lightning shows the latest even unlogged
        shown = {name: float(values[name]) for name in prog_bar if name in values}
        if shown:
            trainer.progress_bar_metrics.update(shown)
        self.pending.update(tensors)

    def flush(self, trainer: Any) -> None:
        """Hand this step's values to the loggers if Lightning would log on-step metrics now."""
        pending, self.pending = self.pending, {}
        if trainer is None or not pending or not trainer.loggers:
            return
        connector = trainer._logger_connector  # Lightning's own on-step path, same step value
        if connector.should_update_logs or trainer.fast_dev_run:
            connector.log_metrics(pending)
