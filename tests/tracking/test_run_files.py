"""metrics.csv (one flushed row per optimizer step, resumable) and summary.json."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from frlab.tracking.run_files import RunFilesCallback, read_metrics, scalar_metrics, summarize


def fake_trainer(step: int = 0, **metrics: float) -> SimpleNamespace:
    return SimpleNamespace(global_step=step, callback_metrics=dict(metrics), is_global_zero=True)


def drive(cb: RunFilesCallback, rewards: list[float], start: int = 0) -> SimpleNamespace:
    trainer = fake_trainer(start)
    cb.on_train_start(trainer, None)
    for i, r in enumerate(rewards, start=start + 1):
        trainer.global_step = i
        trainer.callback_metrics = {
            "train/reward_mean": r,
            "train/acceptance_rate": 0.5,
            "train/policy_lag_mean": 1.0,
            "train/policy_lag_max": float(i % 3),
            "timing/step_s": 0.1,
            "val/ignored": 1.0,
            "train/loss_epoch": 9.0,
        }
        cb.on_train_batch_end(trainer, None, None, None, i - 1)
    return trainer


def test_step_metrics_filters_and_renames() -> None:
    got = scalar_metrics({"train/a_step": 1, "train/a_epoch": 2, "timing/t": 3, "other": 4})
    assert got == {"train/a": 1.0, "timing/t": 3.0}


def test_one_row_per_step_flushed_while_running(tmp_path: Path) -> None:
    cb = RunFilesCallback(tmp_path, components={"trust_region": "sequence_bernoulli_kl"})
    trainer = drive(cb, [0.0, 0.5])
    # Still open (no on_train_end): the rows are on disk already.
    rows = read_metrics(tmp_path / "metrics.csv")
    assert [r["step"] for r in rows] == [1.0, 2.0]
    assert rows[1]["train/reward_mean"] == 0.5
    header = next(csv.reader((tmp_path / "metrics.csv").open()))
    assert header[:2] == ["step", "elapsed_s"]
    assert "val/ignored" not in header and "train/loss_epoch" not in header
    cb.on_train_end(trainer, None)


def test_a_new_metric_widens_the_header(tmp_path: Path) -> None:
    cb = RunFilesCallback(tmp_path)
    cb.on_train_start(fake_trainer(0), None)
    cb.on_train_batch_end(fake_trainer(1, **{"train/reward_mean": 0.1}), None, None, None, 0)
    cb.on_train_batch_end(
        fake_trainer(2, **{"train/reward_mean": 0.2, "train/x": 7}), None, None, None, 1
    )
    rows = read_metrics(tmp_path)
    assert math.isnan(rows[0]["train/x"]) and rows[1]["train/x"] == 7.0


def test_summary_first_and_last_windows(tmp_path: Path) -> None:
    rewards = [0.0] * 10 + [0.5] * 10 + [1.0] * 10
    cb = RunFilesCallback(tmp_path, components={"baseline": "batch_mean"}, extra={"plan": {"B": 4}})
    trainer = drive(cb, rewards)
    cb.on_train_end(trainer, None)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 30 and summary["rows"] == 30
    assert summary["reward_mean_first_10"] == 0.0
    assert summary["reward_mean_last_10"] == 1.0
    assert summary["reward_mean_last_20"] == 0.75
    assert summary["acceptance_rate_mean"] == 0.5 and summary["policy_lag_max"] == 2.0
    assert summary["objective"] == {"baseline": "batch_mean"}
    assert summary["output_dir"] == str(tmp_path) and summary["plan"] == {"B": 4}
    assert summary["status"] == "finished" and summary["wall_time_s"] >= 0.0


def test_resume_appends_and_drops_rows_past_the_checkpoint(tmp_path: Path) -> None:
    first = RunFilesCallback(tmp_path)
    drive(first, [0.1, 0.2, 0.3, 0.4])  # crash after step 4; last checkpoint at step 3
    second = RunFilesCallback(tmp_path)
    trainer = drive(second, [0.9, 1.0], start=3)
    second.on_train_end(trainer, None)
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert [r["train/reward_mean"] for r in rows] == [0.1, 0.2, 0.3, 0.9, 1.0]
    elapsed = [r["elapsed_s"] for r in rows]
    assert elapsed == sorted(elapsed), "elapsed time continues across the resume"
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 5


def test_exception_writes_a_failed_summary(tmp_path: Path) -> None:
    cb = RunFilesCallback(tmp_path)
    trainer = drive(cb, [0.2])
    cb.on_exception(trainer, None, RuntimeError("engine died"))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "engine died" in summary["error"]
    assert summary["steps"] == 1


def test_a_run_that_fails_before_training_keeps_the_previous_summary(tmp_path: Path) -> None:
    """A resume that fails while loading its checkpoint used to overwrite summary.json with
    0 steps and 0 rows."""
    first = RunFilesCallback(tmp_path)
    drive(first, [0.1, 0.2, 0.3])
    first.finish("finished")
    before = (tmp_path / "summary.json").read_bytes()
    resumed = RunFilesCallback(tmp_path)
    resumed.on_exception(fake_trainer(0), None, RuntimeError("bad checkpoint"))
    assert (tmp_path / "summary.json").read_bytes() == before


def test_a_signal_records_status_interrupted_and_the_signal(tmp_path: Path) -> None:
    import signal

    from frlab.stop import RunInterrupted

    cb = RunFilesCallback(tmp_path)
    trainer = drive(cb, [0.2, 0.4])
    cb.on_exception(trainer, None, RunInterrupted(signal.SIGTERM, safe=True))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == "SIGTERM"
    assert summary["steps"] == 2


def test_summary_records_the_rollout_pools_counters(tmp_path: Path) -> None:
    cb = RunFilesCallback(tmp_path)
    trainer = drive(cb, [0.2])
    stats = {"failed_by_reason": {"env_error": 2}, "rejected_by_reason": {}, "finished": 9}
    trainer.datamodule = SimpleNamespace(pool=SimpleNamespace(stats=lambda: stats))
    cb.on_train_end(trainer, None)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rollout_stats"] == stats
    header = (tmp_path / "metrics.csv").read_text().splitlines()[1]
    assert header.startswith("1,"), "the step column is an integer"


def test_other_ranks_write_nothing(tmp_path: Path) -> None:
    cb = RunFilesCallback(tmp_path / "run")
    trainer = SimpleNamespace(global_step=1, callback_metrics={}, is_global_zero=False)
    cb.on_train_start(trainer, None)
    cb.on_train_batch_end(trainer, None, None, None, 0)
    cb.on_train_end(trainer, None)
    assert not (tmp_path / "run").exists()


def test_summarize_empty() -> None:
    s = summarize([])
    assert s["steps"] == 0 and s["reward_mean_first_10"] is None


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Using ModelCheckpoint with manual optimization")
def test_in_a_real_lightning_run(tmp_path: Path) -> None:
    """A dummy manual-optimisation module logging the SCHEMA metrics for 12 steps, then resume."""
    import lightning as L
    import torch

    from frlab.tracking import ProgressBar

    class Dummy(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> None:
            opt = self.optimizers()
            loss = ((self.w - 1.0) ** 2).sum()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
            step = float(self.trainer.global_step)
            self.log("train/reward_mean", step / 12, prog_bar=True)
            self.log("train/acceptance_rate", 1.0, prog_bar=True)
            self.log("train/policy_lag_mean", 0.0, prog_bar=True)
            self.log("train/loss", loss.detach())

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self) -> list[torch.Tensor]:
            return [torch.zeros(1)] * 1000

    def fit(steps: int, ckpt: str | None) -> RunFilesCallback:
        cb = RunFilesCallback(tmp_path, components={"trust_region": "none"})
        ckpt_cb = L.pytorch.callbacks.ModelCheckpoint(
            dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=4, save_top_k=0
        )
        trainer = L.Trainer(
            max_steps=steps,
            logger=False,
            callbacks=[cb, ProgressBar(), ckpt_cb],
            enable_model_summary=False,
            accelerator="cpu",
            devices=1,
        )
        trainer.fit(Dummy(), ckpt_path=ckpt)
        return cb

    fit(12, None)
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [float(i) for i in range(1, 13)]
    assert rows[-1]["train/reward_mean"] == pytest.approx(1.0)
    assert {"train/loss", "train/acceptance_rate", "train/policy_lag_mean"} <= set(rows[0])
    cb = fit(16, str(tmp_path / "ckpt" / "last.ckpt"))
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [float(i) for i in range(1, 17)]
    assert cb.summary["steps"] == 16 and cb.summary["rows"] == 16
