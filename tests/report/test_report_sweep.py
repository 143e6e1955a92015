"""The whole way from a sweep to its table: a real toy sweep of 2 arms x 3 seeds run by
`python -m frlab -m`, then `python -m frlab.report` on its folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("rliable", reason="the report extra (rliable) is not installed")

REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


@pytest.mark.slow
def test_a_real_toy_sweep_reports_its_arms_and_seeds(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    launch = [
        sys.executable,
        "-m",
        "frlab",
        "-m",
        "experiment=toy_cpu",
        "objective.trust_region=sequence_bernoulli_kl,none",
        "seed=0,1,2",
        "trainer.max_steps=6",
        "data.batch_size=16",
        "data.micro_batch_size=16",
        "rollout.max_in_flight=16",
        "callbacks.model_checkpoint.enabled=false",
        "plots=false",
        f"paths.log_dir={tmp_path}",
        f"hydra.sweep.dir={sweep}",
    ]
    done = subprocess.run(launch, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = [
        sys.executable,
        "-m",
        "frlab.report",
        str(sweep),
        "--reps",
        "1000",
        "--threshold",
        "train/reward_mean=0.2",
    ]
    done = subprocess.run(report, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "preset: 3 used of 3 launched" in done.stdout
    assert "objective.trust_region=none: 3 used of 3 launched" in done.stdout
    out = sweep / "report"
    md = (out / "report.md").read_text()
    assert "Config keys that differ between the arms: `objective.trust_region`" in md
    assert md.count("| finished |") == 6 and "| preset (baseline) | 3 of 3 |" in md
    assert "‡" in md  # three seeds: their range, marked low n
    data = json.loads((out / "report.json").read_text())
    (exp,) = data["experiments"]
    assert exp["experiment"] == "toy_cpu" and exp["baseline"] == "preset"
    for arm in exp["arms"]:
        assert sorted(r["seed"] for r in arm["runs"]) == [0, 1, 2]
        assert all(r["last_update"] == 6 and r["status"] == "finished" for r in arm["runs"])
    comparison = exp["comparisons"]["objective.trust_region=none"]["train/reward_mean"]
    assert comparison["paired"] and comparison["n"] == 3 and comparison["method"] == "t"
    assert {p.name for p in (out / "toy_cpu").iterdir()} >= {
        "train_reward_mean.png",
        "intervals.png",
        "threshold_train_reward_mean.png",
    }
