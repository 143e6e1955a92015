"""The extending guide's engine recipe (docs/extending.md) works as written: its example engine, in a package of its own
named in `user_modules`, trains the CPU default for a few updates through `python -m frlab`
with behaviour log-probs equal to the learner's, and preflight asks the class for its modes."""

from __future__ import annotations

import csv
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "extending.md"  # holds the marked example
BEGIN, END = "<!-- engine-example:begin", "<!-- engine-example:end -->"
MODULE, OPTION = "mypkg/engine.py", "myconfigs/rollout/engine/naive.yaml"  # named by the guide


def example() -> dict[str, str]:
    """The marked block's fenced code, by language: python, yaml, bash."""
    text = GUIDE.read_text()
    block = text[text.index(BEGIN) : text.index(END)]
    out = {}
    for lang in ("python", "yaml", "bash"):
        assert block.count(f"```{lang}\n") == 1, f"one {lang} block in the marked example"
        out[lang] = block.split(f"```{lang}\n", 1)[1].split("```", 1)[0]
    return out


def run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """The guide's files under `tmp_path`, then its command with `overrides` added."""
    code, text = example(), GUIDE.read_text()
    for path in (MODULE, OPTION):
        assert f"`{path}`" in text, f"the guide no longer names {path}"
    (tmp_path / "mypkg").mkdir(exist_ok=True)
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / MODULE).write_text(code["python"])
    (tmp_path / OPTION).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / OPTION).write_text(code["yaml"])
    [line] = [ln for ln in code["bash"].splitlines() if "python -m frlab" in ln]
    words = shlex.split(line.replace("$PWD", str(tmp_path)))
    assert words[0] == "PYTHONPATH=" + str(tmp_path) and words[1:4] == ["python", "-m", "frlab"]
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    cmd = [sys.executable, "-m", "frlab", *words[4:], *overrides]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


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
