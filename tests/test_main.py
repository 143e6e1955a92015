"""`python -m frlab`: dry run, multirun folder naming, typo messages, no heavy imports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HYDRA_FULL_ERROR": "0"}


def frlab(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "frlab", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.mark.slow
def test_dry_run_prints_the_plan_and_exits_0(tmp_path: Path) -> None:
    out = frlab("dry_run=true", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    for fragment in (
        "experiment : toy_cpu",
        "B=64 (global)",
        "delta=0.003",
        "lag bound  : <= 2",
        "updates    : 200 optimizer steps",
        "trust_region=sequence_bernoulli_kl",
    ):
        assert fragment in out.stdout, out.stdout
    run_dirs = list((tmp_path / "outputs" / "runs" / "toy_cpu").iterdir())
    assert len(run_dirs) == 1 and f"output dir : {run_dirs[0]}" in out.stdout
    assert not (run_dirs[0] / "metrics.csv").exists()


@pytest.mark.slow
def test_dry_run_task_loads_no_model_and_no_transformers(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from frlab.__main__ import task\n"
        "from frlab.config.compose import compose\n"
        "plan = task(compose(['experiment=r1_distill_1p5b', 'dry_run=true']))\n"
        "assert plan['model'] == 'deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B', plan\n"
        "heavy = [m for m in ('transformers', 'lightning', 'vllm', 'envs.math') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=ENV, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout, out.stdout


def test_preflight_is_fast_once_imported() -> None:
    import time

    from frlab.config.compose import compose
    from frlab.config.preflight import preflight

    cfg = compose(["experiment=python_tool_qwen3_30b_a3b"])
    preflight(cfg)  # warm: imports frlab.objective (torch) once
    t0 = time.perf_counter()
    preflight(cfg)
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.slow
def test_multirun_names_folders_by_the_choices(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    out = frlab("-m", "objective.trust_region=sequence_bernoulli_kl,none", "seed=0,1",
                "dry_run=true", f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    names = sorted(p.name for p in sweep_dir.iterdir() if p.is_dir())
    assert names == [
        "objective.trust_region=none,seed=0", "objective.trust_region=none,seed=1",
        "objective.trust_region=sequence_bernoulli_kl,seed=0",
        "objective.trust_region=sequence_bernoulli_kl,seed=1",
    ]  # fmt: skip
    assert out.stdout.count("frlab plan") == 4


@pytest.mark.slow
def test_sweep_preset_runs_without_dash_m(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    out = frlab("sweep=toy_trust_regions", "dry_run=true", f"hydra.sweep.dir={sweep_dir}",
                cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    names = sorted(p.name for p in sweep_dir.iterdir() if p.is_dir())
    assert names == [
        f"objective.trust_region={t},seed=0" for t in ("none", "sequence_bernoulli_kl", "token_tis")
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["objective=flashreinforse"], "did you mean 'flashreinforce'"),
        (["rollout.max_inflight=3"], "did you mean 'max_in_flight'"),
        (["rollout.sampling.top_p=0.9"], "config key `rollout.sampling.top_p`"),
    ],
)
def test_config_errors_exit_2_with_the_key(tmp_path: Path, args: list[str], fragment: str) -> None:
    out = frlab(*args, "dry_run=true", cwd=tmp_path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "frlab: config error:" in out.stderr and fragment in out.stderr, out.stderr
