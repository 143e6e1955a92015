"""A real `python -m frlab` run: every diagnostic reaches the one metrics.csv of the run folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from frlab.learner import metrics
from frlab.rollout.callbacks import POOL_COUNTERS
from frlab.tracking import read_metrics

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HYDRA_FULL_ERROR": "0"}


@pytest.mark.slow
def test_ppo_clip_run_logs_component_lag_and_pool_counters_in_one_file(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = [
        f"hydra.run.dir={run_dir}",
        "objective.trust_region=ppo_clip",
        "data.batch_size=8",
        "data.micro_batch_size=4",
        "rollout.max_in_flight=8",
        "trainer.max_steps=3",
        "plots=false",
        "optim.skip_zero_signal_steps=false",
    ]  # every step runs its forward

    out = subprocess.run(
        [sys.executable, "-m", "frlab", *args],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1.0, 2.0, 3.0]
    expected = {
        "train/ppo_clip/clip_fraction",
        metrics.LAG_TOKEN_MEAN,
        metrics.LAG_MEAN,
        metrics.SEQUENCE_KL,
        metrics.RETAINED_FRAC,
        *(f"rollout/{c}" for c in POOL_COUNTERS),
    }
    for row in rows:
        assert expected <= {k for k, v in row.items() if v == v}, sorted(row)  # not NaN
        assert 0.0 <= row["train/ppo_clip/clip_fraction"] <= 1.0
    assert metrics.ACCEPTANCE not in rows[0]  # 1 by construction for ppo_clip: not logged
    assert list(run_dir.rglob("metrics.csv")) == [run_dir / "metrics.csv"]  # one writer
