"""`python -m frlab`: dry run, multirun folders, typo messages, exit codes, no heavy imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HYDRA_FULL_ERROR": "0"}


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
def test_dry_run_prints_the_plan_and_exits_0(tmp_path: Path) -> None:
    out = frlab("dry_run=true", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # the plan's column width follows its longest row name
    for fragment in (
        "experiment : toy_cpu",
        "B=64 (global)",
        "delta=0.003",
        "lag bound : <= 2",
        "updates : 300 optimizer steps",
        "trust_region=sequence_bernoulli_kl",
    ):
        assert fragment in text, out.stdout
    run_dirs = list((tmp_path / "outputs" / "runs" / "toy_cpu").iterdir())
    assert len(run_dirs) == 1 and f"output dir : {run_dirs[0]}" in text
    assert not (run_dirs[0] / "metrics.csv").exists()


@pytest.mark.slow
def test_dry_run_task_loads_no_model_and_no_transformers(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from frlab.train import run\n"
        "from frlab.config.compose import compose\n"
        "plan = run(compose(['experiment=r1_distill_1p5b', 'dry_run=true']))\n"
        "assert plan['model'] == 'deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B', plan\n"
        "heavy = [m for m in ('transformers', 'lightning', 'vllm', 'datasets', 'math_verify',\n"
        "                      'sympy') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout, out.stdout


@pytest.mark.slow
def test_multirun_names_folders_by_the_choices(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    out = frlab(
        "-m",
        "objective.trust_region=sequence_bernoulli_kl,none",
        "seed=0,1",
        "dry_run=true",
        f"hydra.sweep.dir={sweep_dir}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    names = sorted(p.name for p in sweep_dir.iterdir() if p.is_dir())
    assert names == [
        "objective.trust_region=none,seed=0",
        "objective.trust_region=none,seed=1",
        "objective.trust_region=sequence_bernoulli_kl,seed=0",
        "objective.trust_region=sequence_bernoulli_kl,seed=1",
    ]
    assert out.stdout.count("frlab plan") == 4


@pytest.mark.slow
def test_sweep_preset_runs_without_dash_m(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    out = frlab(
        "sweep=toy_trust_regions", "dry_run=true", f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    names = sorted(p.name for p in sweep_dir.iterdir() if p.is_dir())
    assert names == [
        f"objective.trust_region={t},seed={s}"
        for t in ("none", "sequence_bernoulli_kl", "token_tis")
        for s in range(5)
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["objective=flashreinforse"], "did you mean 'flashreinforce'"),
        (["rollout.max_inflight=3"], "did you mean 'max_in_flight'"),
        (["rollout.sampling.top_p=0.9"], "config key `rollout.sampling.top_p`"),
        (["rollout.temperature=0"], "did you mean 'rollout.sampling.temperature'"),
        (["data.batch_size=abc"], "config key `data.batch_size`: Value 'abc'"),
        (["-m", "objective=grpo,rlo"], "did you mean 'rloo'"),
        (["rollout.engine=torhc"], "did you mean 'torch'"),
        (["-m", "data.pack_sequences=false,3"], "`data.pack_sequences`: must be true or false"),
    ],
)
def test_config_errors_exit_2_with_the_key(tmp_path: Path, args: list[str], fragment: str) -> None:
    out = frlab(*args, "dry_run=true", cwd=tmp_path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "frlab: config error:" in out.stderr and fragment in out.stderr, out.stderr


@pytest.mark.slow
def test_a_sweep_presets_value_on_a_bool_key_is_refused_in_its_job(tmp_path: Path) -> None:
    """A sweep preset's values reach each job as its overrides, not on the command line: the
    job's preflight checks them (job 0 runs, job 1's `3` is refused instead of read as true)."""
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "badbool.yaml").write_text(
        "# @package _global_\nhydra:\n  mode: MULTIRUN\n  sweeper:\n    params:\n"
        "      data.pack_sequences: false,3\n"
    )
    out = frlab(f"--config-dir={tmp_path}", "sweep=badbool", "dry_run=true", cwd=tmp_path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stdout.count("frlab plan") == 1, out.stdout
    assert "`data.pack_sequences`: must be true or false, got 3" in out.stderr, out.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--config-dir=/nonexistent"], "Additional config directory '/nonexistent' not found"),
        (["seed=${oc.env:FRLAB_NO_SUCH_VARIABLE}"], "Traceback (most recent call last)"),
    ],
)
def test_other_errors_exit_1(tmp_path: Path, args: list[str], fragment: str) -> None:
    """Hydra's own short errors keep its message; any other exception its traceback."""
    out = frlab(*args, "dry_run=true", cwd=tmp_path)
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert fragment in out.stderr and "frlab: config error" not in out.stderr, out.stderr


@pytest.mark.slow
def test_a_gpu_preset_on_a_cpu_machine_fails_at_once_pointing_to_dry_run(tmp_path: Path) -> None:
    from frlab.run.machine import gpu_visible

    if gpu_visible():
        pytest.skip("this machine has a GPU")
    out = frlab("experiment=alfworld_qwen7b", cwd=tmp_path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "config key `trainer.accelerator`" in out.stderr and "dry_run=true" in out.stderr


def _read_rows(run_dir: Path) -> list[dict[str, float]]:
    from frlab.tracking import read_metrics

    return read_metrics(run_dir / "metrics.csv")


@pytest.mark.slow
def test_a_short_run_writes_run_files_and_resumes_from_last(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    common = [
        f"hydra.run.dir={run_dir}",
        "data.batch_size=8",
        "data.micro_batch_size=4",
        "rollout.max_in_flight=8",
        "callbacks.model_checkpoint.every_n_train_steps=2",
    ]
    out = frlab(*common, "trainer.max_steps=4", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [r["step"] for r in _read_rows(run_dir)] == [1.0, 2.0, 3.0, 4.0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 4
    assert summary["objective"]["trust_region"] == "sequence_bernoulli_kl"
    assert (
        summary["plan"]["data.batch_size"] == 8 and summary["plan"]["micro_batches_per_step"] == 2
    )
    for name in ("reward", "acceptance", "lag", "response_length"):
        assert (run_dir / "plots" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()

    out = frlab(*common, "trainer.max_steps=6", "ckpt_path=last", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = _read_rows(run_dir)
    assert [r["step"] for r in rows] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 6


@pytest.mark.slow
def test_the_embedded_default_learns(tmp_path: Path) -> None:
    """`python -m frlab` (toy_cpu): first 10 updates <= 0.3 mean reward, last 20 >= 0.8.

    Before zero-advantage batches stopped moving the policy (AdamW stepped on stale moments),
    1 of 4 repeats fell back to 0.73 after solving the task; after, 8 of 8 ended >= 0.98."""
    run_dir = tmp_path / "default"
    out = frlab(f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 300
    assert summary["reward_mean_first_10"] <= 0.3, summary
    assert summary["reward_mean_last_20"] >= 0.8, summary


def test_env_factory_builds_a_fresh_env_per_call() -> None:
    from omegaconf import OmegaConf

    from frlab.rollout.pool.factory import env_factory

    make = env_factory(OmegaConf.create({"_target_": "envs.toy.ParityEnv", "num_digits": 5}))
    a, b = make(), make()
    assert a is not b and type(a).__name__ == "ParityEnv" and a.num_digits == 5


def test_env_factory_reports_a_missing_environment_at_its_key() -> None:
    from omegaconf import OmegaConf

    from frlab.rollout.pool.factory import env_factory

    with pytest.raises(ValueError, match="env._target_`: Error locating target"):
        env_factory(OmegaConf.create({"_target_": "envs.not_written_yet.SomeEnv"}))


def test_vocab_must_cover_the_tokenizer() -> None:
    from frlab.model.tokenizer import check_vocab

    class Tok:
        def __len__(self) -> int:
            return 61

    check_vocab({"name_or_path": None, "config": {"vocab_size": 64}}, Tok())
    with pytest.raises(ValueError, match="model.config.vocab_size"):
        check_vocab({"name_or_path": None, "config": {"vocab_size": 32}}, Tok())
