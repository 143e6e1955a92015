"""The extending guide's engine recipe (docs/extending.md) works as written: its example engine, in a package of its own
named in `user_modules`, trains the CPU default for a few updates through `python -m frlab`
with behaviour log-probs equal to the learner's, and preflight asks the class for its modes."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "extending.md"  # holds the marked example
BEGIN, END = "<!-- engine-example:begin", "<!-- engine-example:end -->"
OPTION = "_target_: mypkg.engine.NaiveEngine.for_policy\n_partial_: true\n"


def example() -> str:
    text = GUIDE.read_text()
    block = text[text.index(BEGIN) : text.index(END)]
    return block.split("```python\n", 1)[1].rsplit("```", 1)[0]


def run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    package = tmp_path / "mypkg"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "engine.py").write_text(example())
    group = tmp_path / "myconfigs" / "rollout" / "engine"  # the engine as a config-group option
    group.mkdir(parents=True, exist_ok=True)
    (group / "naive.yaml").write_text(OPTION)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "frlab", "user_modules=[mypkg]",
           f"hydra.searchpath=[file://{tmp_path / 'myconfigs'}]", "rollout/engine=naive", *overrides]  # fmt: skip
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_readme_engine_trains_through_python_m_frlab(tmp_path: Path) -> None:
    out = run(tmp_path, "trainer.max_steps=3", "rollout.max_in_flight=16",
              f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    with (tmp_path / "run" / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("step")]
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    assert float(rows[0]["train/sequence_kl_mean"]) < 1e-6  # its log-probs are the learner's
    assert all(float(r["train/acceptance_rate"]) > 0.9 for r in rows)


def test_preflight_asks_the_engine_class_for_its_modes(tmp_path: Path) -> None:
    plan = run(tmp_path, "dry_run=true")
    assert plan.returncode == 0, plan.stderr[-4000:]
    assert "mypkg.engine.NaiveEngine.for_policy" in plan.stdout
    refused = run(tmp_path, "dry_run=true", "rollout.weight_update=in_flight")
    assert refused.returncode == 2 and "rollout.weight_update" in refused.stderr, refused.stderr[
        -2000:
    ]
