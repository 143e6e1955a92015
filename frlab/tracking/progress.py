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

While the rollout engine's fleet is down no update ends, so no hook redraws the bar: a
watcher thread asks the trainer's rollout pool (`pool.outage_s()`) every OUTAGE_POLL_S and
labels the bar `updates (fleet down 35 s)` for as long as the outage lasts.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from collections.abc import Callable
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
LABEL = "updates"
OUTAGE_POLL_S = 1.0


def bar_label(outage_s: float | None) -> str:
    """The bar's description: `updates`, or `updates (fleet down 35 s)` during an outage."""
    return LABEL if outage_s is None else f"{LABEL} (fleet down {outage_s:.0f} s)"


class OutageLabel:
    """A daemon thread that relabels `bar()` (None: no bar) from `outage_s()` every `poll_s`
    until `stop()`; it writes only when the label changes."""

    def __init__(
        self, bar: Callable[[], Any], outage_s: Callable[[], float | None], poll_s: float
    ) -> None:
        self.bar, self.outage_s, self.poll_s = bar, outage_s, poll_s
        self.shown = LABEL
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="frlab-outage-label", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.relabel()

    def relabel(self) -> None:
        """Show the label for the outage now (a pool or bar that fails is left alone)."""
        try:
            label, bar = bar_label(self.outage_s()), self.bar()
            if bar is not None and label != self.shown:
                bar.set_description(label, refresh=True)
                self.shown = label
        except Exception:  # a display must never stop the run
            logging.getLogger(__name__).debug("outage label not updated", exc_info=True)


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
        self._outage_label: OutageLabel | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        super().on_train_start(trainer, pl_module)
        pool = getattr(getattr(trainer, "datamodule", None), "pool", None)
        outage_s = getattr(pool, "outage_s", None)
        if callable(outage_s) and not self.is_disabled:
            bar = lambda: self._train_progress_bar  # noqa: E731  (read when it relabels)
            self._outage_label = OutageLabel(bar, outage_s, OUTAGE_POLL_S)
            self._outage_label.start()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._stop_outage_label()
        super().on_train_end(trainer, pl_module)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._stop_outage_label()
        super().on_exception(trainer, pl_module, exception)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._stop_outage_label()
        super().teardown(trainer, pl_module, stage)

    def _stop_outage_label(self) -> None:
        if self._outage_label is not None:
            self._outage_label.stop()
            self._outage_label = None

    def init_train_tqdm(self) -> Tqdm:
        """The bar, labelled and sized from the first draw (total max_steps, at global_step)."""
        trainer = self._trainer
        steps = getattr(trainer, "max_steps", -1) if trainer is not None else -1
        return Tqdm(
            desc=LABEL,
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

    def get_metrics(  # type: ignore[override]
        self, trainer: Any, pl_module: Any
    ) -> dict[str, int | str]:
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
        bar.set_description(LABEL, refresh=False)
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
