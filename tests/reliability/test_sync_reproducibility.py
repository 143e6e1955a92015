"""Sync mode is bit-reproducible on the CPU torch engine (the default toy experiment): two
`python -m frlab rollout.mode=sync` runs with the same seed write identical metrics.csv files,
timing columns aside, and so does a run stopped after 3 updates and resumed from its
checkpoint; another seed gives other values."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}
TIMING = ("elapsed_s", "timing/")
THREADS = 2  # torch threads of both runs of the engine comparison


def run(
    folder: Path, steps: int, *overrides: str, threads: int | None = None
) -> list[dict[str, str]]:
    """Train in a fresh process (with `threads` torch threads, else torch's default); the
    metrics.csv rows without timing columns."""
    args = [
        "rollout.mode=sync",
        f"trainer.max_steps={steps}",
        "plots=false",
        "callbacks.model_checkpoint.every_n_train_steps=3",
        f"hydra.run.dir={folder}",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "frlab", *args, *overrides],
        env=ENV if threads is None else {**ENV, "OMP_NUM_THREADS": str(threads)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    with open(folder / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return [{k: v for k, v in row.items() if not k.startswith(TIMING)} for row in rows]


@pytest.mark.slow
def test_sync_runs_with_the_same_seed_write_identical_metrics(tmp_path: Path) -> None:
    first = run(tmp_path / "a", 6)
    assert len(first) == 6 and "train/reward_mean" in first[0] and "train/loss" in first[0]
    assert run(tmp_path / "b", 6) == first
    run(tmp_path / "c", 3)
    assert run(tmp_path / "c", 6, "ckpt_path=last") == first  # resumed after step 3
    other = run(tmp_path / "d", 2, "seed=1")
    assert [r["train/loss"] for r in other] != [r["train/loss"] for r in first[:2]]


@pytest.mark.slow
def test_the_process_engine_trains_exactly_as_the_in_process_engine(tmp_path: Path) -> None:
    """rollout/engine=torch_process (a child process, shared-memory weights) samples with the
    same code, seeds and thread count, so a sync run's metrics are identical to the default's.
    Both runs get THREADS torch threads explicitly (the in-process engine through
    OMP_NUM_THREADS, the child through its setting): another count changes the last bits."""
    threads = f"rollout.engine.num_threads={THREADS}"
    process = run(tmp_path / "p", 4, "rollout/engine=torch_process", threads, threads=THREADS)
    assert len(process) == 4 and process == run(tmp_path / "t", 4, threads=THREADS)
