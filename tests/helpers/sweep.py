"""Sweep presets expanded by Hydra's own sweeper, for tests that check every job of a sweep.

`sweep_jobs(name)` runs `python -m frlab -m sweep=NAME dry_run=true` once per preset (cached
for the test session) in a temporary folder: Hydra's basic sweeper composes and launches each
job, and frlab's `task` preflights it and returns the plan. `RecordJob`, a Hydra callback
added on that command line, writes each job's overrides, resolved config and plan into its job
folder; `sweep_jobs` reads them back, in the order Hydra numbered the jobs. Data locations
are fixed (FRLAB_DATA_DIR=/data, ALFWORLD_DATA=/alfworld) so the plans do not depend on the
machine's environment.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

RECORD = "sweep_job.json"
ENV = {
    "FRLAB_DATA_DIR": "/data",
    "ALFWORLD_DATA": "/alfworld",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


class RecordJob(Callback):
    """Writes a finished job's overrides, resolved config (without `hydra`) and plan."""

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if job_return.status != JobStatus.COMPLETED:
            return
        resolved = OmegaConf.to_container(config, resolve=True)
        assert isinstance(resolved, dict)
        resolved.pop("hydra")
        record = {
            "num": int(config.hydra.job.num),
            "overrides": list(config.hydra.overrides.task),
            "config": resolved,
            "plan": job_return.return_value,
        }
        path = Path(str(config.hydra.runtime.output_dir)) / RECORD
        path.write_text(json.dumps(record))


@dataclass(frozen=True)
class SweepJob:
    overrides: list[str]
    cfg: DictConfig
    plan: dict[str, Any]


@functools.cache
def _records(name: str) -> tuple[dict[str, Any], ...]:
    # the jobs import helpers.sweep.RecordJob: tests/ goes on the path AFTER the repository,
    # whose `envs` package a test folder of the same name must not shadow
    root, tests = (str(Path(__file__).resolve().parents[i]) for i in (2, 1))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH"), tests) if p)
    env = {**os.environ, **ENV, "PYTHONPATH": path}
    with tempfile.TemporaryDirectory() as tmp:
        sweep_dir = Path(tmp) / "sweep"
        args = [
            "-m",
            f"sweep={name}",
            "dry_run=true",
            f"hydra.sweep.dir={sweep_dir}",
            f"+hydra.callbacks.record_job._target_={__name__}.RecordJob",
        ]
        out = subprocess.run(
            [sys.executable, "-m", "frlab", *args],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, f"sweep={name}: {out.stderr[-3000:]}"
        records = [json.loads(p.read_text()) for p in sweep_dir.glob(f"*/{RECORD}")]
    assert out.stdout.count("frlab plan") == len(records), out.stdout[-3000:]
    return tuple(sorted(records, key=lambda r: r["num"]))


def sweep_jobs(name: str) -> list[SweepJob]:
    """Every job of sweep preset `name`, as Hydra's basic sweeper launched it (a fresh copy)."""
    return [
        SweepJob(list(r["overrides"]), OmegaConf.create(r["config"]), copy.deepcopy(r["plan"]))
        for r in _records(name)
    ]
