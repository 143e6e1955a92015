"""`StepLog` sends a step's scalars exactly where Lightning's `self.log(on_step=True,
on_epoch=False)` does: checked against Lightning itself (callback and progress-bar metrics seen
by callbacks at every step, the logged metrics, and a real `CSVLogger` file), with
`log_every_n_steps` and a stop request from a callback in the middle of an interval."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from frlab.learner.step_log import StepLog

PROG_BAR = ("m/a",)


def step_values(step: int) -> dict[str, float]:
    return {"m/a": 0.5 * step, "m/b": step * step - 3.25, "timing/x": 1.0 / (step + 1)}


class Module(L.LightningModule):
    """Manual optimization, one step per batch; logs through Lightning or through StepLog."""

    def __init__(self, via_step_log: bool) -> None:
        super().__init__()
        self.via_step_log = via_step_log
        self.automatic_optimization = False
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.step_log = StepLog() if via_step_log else None

    def training_step(self, batch: Any, batch_idx: int) -> None:
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward((self.w - 1.0).pow(2).sum())
        optimizer.step()
        values = step_values(batch_idx)
        if self.step_log is not None:
            self.step_log.add(self._trainer, values, PROG_BAR)
        else:
            for name, value in values.items():
                self.log(name, value, on_step=True, on_epoch=False, prog_bar=name in PROG_BAR)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.step_log is not None:
            self.step_log.flush(self._trainer)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(list(range(20)), batch_size=None)


class Watcher(L.Callback):
    """Logs a callback metric (as WeightSyncCallback does), records what callbacks see, and
    asks to stop after `stop_after` batches."""

    def __init__(self, stop_after: int) -> None:
        self.stop_after = stop_after
        self.seen: list[tuple[dict[str, float], dict[str, float]]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        extra = {"rollout/n": float(10 + batch_idx)}
        if pl_module.step_log is not None:
            pl_module.step_log.add(trainer, extra)
        else:
            pl_module.log_dict(extra, on_step=True, on_epoch=False, batch_size=1)
        callback = {k: float(v) for k, v in trainer.callback_metrics.items()}
        self.seen.append((callback, dict(trainer.progress_bar_metrics)))
        if batch_idx + 1 == self.stop_after:
            trainer.should_stop = True


def fit(
    tmp_path: Path, via_step_log: bool, every: int, stop_after: int, with_logger: bool = True
) -> dict[str, Any]:
    watcher = Watcher(stop_after)
    logger = (
        CSVLogger(tmp_path / f"log_{via_step_log}", name="", version="") if with_logger else False
    )
    trainer = L.Trainer(
        max_epochs=1,
        logger=logger,
        log_every_n_steps=every,
        callbacks=[watcher],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(Module(via_step_log))
    csv = Path(logger.log_dir) / "metrics.csv" if logger else None
    return {
        "seen": watcher.seen,
        "callback": {k: float(v) for k, v in trainer.callback_metrics.items()},
        "pbar": dict(trainer.progress_bar_metrics),
        "logged": {k: float(v) for k, v in trainer.logged_metrics.items()},
        "csv": csv.read_text().splitlines() if csv else None,
    }


def test_step_log_matches_lightning_log_everywhere(tmp_path: Path) -> None:
    for every, stop_after in ((1, 20), (3, 7)):
        by_lightning = fit(tmp_path / f"l{every}", False, every, stop_after)
        by_step_log = fit(tmp_path / f"s{every}", True, every, stop_after)
        assert by_step_log["seen"] == by_lightning["seen"]
        assert by_step_log["callback"] == by_lightning["callback"]
        assert by_step_log["pbar"] == by_lightning["pbar"]
        assert by_step_log["logged"] == by_lightning["logged"]
        header, *rows = by_lightning["csv"]
        assert sorted(header.split(",")) == sorted(by_step_log["csv"][0].split(","))
        assert len(by_step_log["csv"]) == len(by_lightning["csv"])

        # the same rows (the column order follows the order names were first seen)
        def table(lines: list[str]) -> list[dict[str, str]]:
            names = lines[0].split(",")
            return [dict(zip(names, line.split(","), strict=True)) for line in lines[1:]]

        assert table(by_step_log["csv"]) == table(by_lightning["csv"])
        assert len(rows) == (20 if every == 1 else 3)  # steps 3, 6 and the stop at 7


def test_without_a_logger_the_trainer_still_shows_the_latest_values(tmp_path: Path) -> None:
    by_lightning = fit(tmp_path / "l", False, 1, 5, with_logger=False)
    by_step_log = fit(tmp_path / "s", True, 1, 5, with_logger=False)
    expected = {**step_values(4), "rollout/n": 14.0}  # the last step's values, read by benches
    assert by_lightning["logged"] == pytest.approx(expected, rel=1e-6)
    for key in ("seen", "callback", "pbar", "logged"):
        assert by_step_log[key] == by_lightning[key], key


def test_a_module_outside_a_trainer_logs_nowhere() -> None:
    log = StepLog()
    log.add(None, {"m/a": 1.0})
    log.flush(None)
    assert log.pending == {}
