"""The paper presets and sweep arms against the FlashREINFORCE reference settings, value by value.

REFERENCE transcribes the reference implementation's settings files
(yifanzhang-pro/FlashREINFORCE `examples/settings/*.json`: `common.json` merged with
`deepseek_r1_distill_qwen_1p5b_math_sanity.json`, `qwen2p5_math_1p5b_dapo_math.json`,
`qwen2p5_7b_instruct_python_tool_10turn.json`, `qwen3_tool_ablation.json`,
`qwen2p5_7b_instruct_alfworld_50turn.json`, and their `variants`). Its trainer (NVIDIA-NeMo
labs-molt `molt/trainer/rl_trainer.py`) takes the first `data.max_samples` prompts and runs
`len(prompts) // rollout.batch_size * train.num_episodes` updates, which is what the lr
schedule spans. The paper's measured policy lags (about 4 for r1, about 8 for the Qwen3 run)
come from the FlashREINFORCE paper. Each test composes a preset (Hydra compose and the dry-run
plan; no model or data is loaded) and compares it with the table; the sweep arms are the jobs
of `python -m frlab -m sweep=NAME dry_run=true`, as Hydra's sweeper runs them (helpers.sweep).
The frlab choices that differ (where a run stops, the lag bound) are checked against the rule
each preset states.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from helpers.sweep import sweep_jobs
from omegaconf import OmegaConf

from frlab.config.compose import compose
from frlab.config.plan import component_params, components, format_plan
from frlab.config.preflight import preflight


def delta(plan: dict) -> float | None:
    """The trust region's delta (None for a region without one)."""
    return plan.get(f"objective.{plan['objective.trust_region']}.delta")


def q(plan: dict) -> float:
    """The entropy filter's kept fraction of failed trajectories' tokens (1: no filter)."""
    if plan["objective.token_filter"] != "entropy_failures":
        return 1.0
    return plan["objective.entropy_failures.q"]


COMMON: dict[str, Any] = {
    "lr": 1e-6,
    "weight_decay": 0.1,
    "grad_clip": 1.0,
    "warmup_ratio": 0.03,
    "min_lr_ratio": 0.1,
    "temperature": 1.0,
    "top_p": 1.0,
    "samples_per_prompt": 1,
    "eval_every": 100,
    "eval_k": 4,
    "eval_temperature": 0.7,
    "eval_top_p": 0.7,
    "micro_batch": 1,
    "queue": 1,
    "in_flight": 16,
    "scheduler": "cosine",
    "B": 128,
}
AMC_MINERVA_AIME25 = ("AMC23", "Minerva", "AIME25")
REFERENCE: dict[str, dict[str, Any]] = {
    "r1_distill_1p5b": {
        **COMMON,
        "model": "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
        "turns": 1,
        "max_samples": 1460,
        "max_len": 9216,
        "max_new_tokens": 8192,
        "in_flight": 512,
        "queue": 8,
        "episodes": 350,
        "delta": 3e-3,
        "q": 1.0,
        "eval_every": 128,
        "eval_k": 32,
        "eval_temperature": 0.6,
        "eval_top_p": 0.95,
        "eval_sets": ("AIME24", "AIME25"),
        "measured_lag": 4,
        "env": "envs.math.MathEnv",
    },
    "qwen_math_1p5b": {
        **COMMON,
        "model": "Qwen/Qwen2.5-Math-1.5B",
        "turns": 1,
        "max_samples": 7500,
        "max_len": 6144,
        "max_new_tokens": 4096,
        "episodes": 68,
        "delta": 3e-3,
        "q": 1.0,
        "micro_batch": 2,
        "eval_sets": AMC_MINERVA_AIME25,
        "measured_lag": None,
        "env": "envs.math.MathEnv",
    },
    "python_tool_qwen7b": {
        **COMMON,
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "turns": 10,
        "max_samples": 7500,
        "max_len": 8192,
        "max_new_tokens": 6144,
        "episodes": 68,
        "delta": 1e-3,
        "q": 1.0,
        "eval_sets": AMC_MINERVA_AIME25,
        "measured_lag": None,
        "env": "envs.python_tool.PythonToolEnv",
    },
    "python_tool_qwen3_30b_a3b": {
        **COMMON,
        "model": "Qwen/Qwen3-30B-A3B",
        "turns": 20,
        "max_samples": 7500,
        "max_len": 16384,
        "max_new_tokens": 14336,
        "queue": 4,
        "episodes": 17,
        "delta": 3e-3,
        "q": 1.0,
        "eval_sets": AMC_MINERVA_AIME25,
        "measured_lag": 8,
        "env": "envs.python_tool.PythonToolEnv",
    },
    "alfworld_qwen7b": {
        **COMMON,
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "turns": 50,
        "max_samples": 1024,
        "max_len": 16384,
        "max_new_tokens": 8192,
        "B": 64,
        "episodes": 20,
        "delta": 1e-3,
        "q": 0.9,
        "scheduler": "constant",
        "eval_every": 40,
        "eval_k": 3,
        "eval_temperature": 1.0,
        "eval_top_p": 0.7,
        "eval_sets": ("seen", "unseen"),
        "measured_lag": None,
        "env": "envs.alfworld.AlfworldEnv",
    },
}
# frlab choices, stated in each preset: where the run stops (a headline step of the paper, or
# the end of the reference schedule).
STOPS = {
    "r1_distill_1p5b": 3850,
    "qwen_math_1p5b": 2000,
    "python_tool_qwen7b": 600,
    "python_tool_qwen3_30b_a3b": 986,
    "alfworld_qwen7b": 200,
}


def reference_updates(ref: dict[str, Any], prompts_per_update: int | None = None) -> int:
    """The reference trainer's update count (and lr-schedule length)."""
    return ref["max_samples"] // (prompts_per_update or ref["B"]) * ref["episodes"]


def test_the_reference_update_counts_are_the_published_ones() -> None:
    assert [reference_updates(REFERENCE[n]) for n in STOPS] == [3850, 3944, 3944, 986, 320]


def _setup(name: str, monkeypatch: pytest.MonkeyPatch, *overrides: str) -> tuple[Any, Any]:
    monkeypatch.setenv("ALFWORLD_DATA", "/alfworld")
    monkeypatch.setenv("FRLAB_DATA_DIR", "/data")
    cfg = compose([f"experiment={name}", *overrides])
    return cfg, preflight(cfg)


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_preset_equals_the_reference_setting(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = REFERENCE[name]
    cfg, plan = _setup(name, monkeypatch)
    assert (plan["model"], plan["env._target_"], plan["rollout.max_turns"]) == (
        ref["model"],
        ref["env"],
        ref["turns"],
    )
    assert (plan["data.batch_size"], plan["rollout.samples_per_prompt"]) == (
        ref["B"],
        ref["samples_per_prompt"],
    )
    assert (plan["rollout.max_len"], plan["rollout.sampling.max_new_tokens"]) == (
        ref["max_len"],
        ref["max_new_tokens"],
    )
    assert plan["rollout.max_in_flight"] == ref["in_flight"]
    assert delta(plan) == pytest.approx(ref["delta"]) and q(plan) == pytest.approx(ref["q"])
    assert plan["data.micro_batch_size"] == ref["micro_batch"]
    assert (plan["rollout.mode"], plan["trainer.precision"], plan["rollout.engine"]) == (
        "async",
        "bf16-mixed",
        "vllm",
    )
    assert components(plan) == {
        "baseline": "batch_mean",
        "trust_region": "sequence_bernoulli_kl",
        "aggregation": "sample_mean",
        "token_filter": "entropy_failures" if ref["q"] < 1 else "none",
    }
    optim = cfg.optim
    assert (optim.lr, optim.weight_decay, optim.grad_clip) == (
        ref["lr"],
        ref["weight_decay"],
        ref["grad_clip"],
    )
    assert plan["optim.scheduler"] == ref["scheduler"]
    assert plan["schedule_length"] == reference_updates(ref)
    if ref["scheduler"] == "cosine":
        assert (plan["optim.warmup_ratio"], plan["optim.min_lr_ratio"]) == (
            ref["warmup_ratio"],
            ref["min_lr_ratio"],
        )
    else:
        assert plan["optim.warmup_ratio"] == 0.0
    sampling = cfg.rollout.sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (
        ref["temperature"],
        ref["top_p"],
        0,
    )
    ev = OmegaConf.to_container(cfg.eval, resolve=True)
    assert (ev["every_n_steps"], ev["k"], ev["at_start"]) == (
        ref["eval_every"],
        ref["eval_k"],
        True,
    )
    assert (ev["sampling"]["temperature"], ev["sampling"]["top_p"]) == (
        ref["eval_temperature"],
        ref["eval_top_p"],
    )
    assert tuple(ev["benchmarks"]) == ref["eval_sets"]


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_stop_step_and_lag_bound_follow_the_stated_rules(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = REFERENCE[name]
    _, plan = _setup(name, monkeypatch)
    assert plan["trainer.max_steps"] == STOPS[name] <= plan["schedule_length"]
    # Hard lag bound = twice the lag the paper measured; where it measured none, twice the
    # reference pipeline's own lag, ceil(in flight / B) + queue depth.
    expected = ref["measured_lag"] or math.ceil(ref["in_flight"] / ref["B"]) + ref["queue"]
    assert plan["rollout.max_policy_lag"] == 2 * expected
    if ref["measured_lag"] is not None:
        assert (
            plan["rollout.max_policy_lag"] >= ref["measured_lag"]
        )  # the paper's lags are admitted
    assert plan["rollout.sync_every"] <= plan["rollout.max_policy_lag"]


# Training data as the reference: (env keys, values).
DATA = {
    "r1_distill_1p5b": {
        "source": "/data/Sanity-Test-R1D-1.5B/train/math_1460.parquet",
        "limit": None,
        "question_key": "prompt",
        "answer_key": "reward_model.ground_truth",
        "template": "messages",
        "deduplicate": False,
    },
    "qwen_math_1p5b": {
        "source": "BytedTsinghua-SIA/DAPO-Math-17k",
        "subset": "default",
        "split": "train",
        "question_key": "prompt",
        "answer_key": "reward_model.ground_truth",
        "deduplicate": True,
        "limit": 7500,
        "template": "messages",
    },
    "python_tool_qwen7b": {"data_path": "/data/dapo_math_7500_tool.jsonl"},
    "python_tool_qwen3_30b_a3b": {"data_path": "/data/dapo_math_7500_tool.jsonl"},
    "alfworld_qwen7b": {
        "data_dir": "/alfworld/json_2.1.1/train",
        "num_games": 1024,
        "step_timeout_s": 60.0,
    },
}


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_preset_trains_on_the_reference_data(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, _ = _setup(name, monkeypatch)
    env = OmegaConf.to_container(cfg.env, resolve=True)
    assert {key: env[key] for key in DATA[name]} == DATA[name]
    if "limit" in DATA[name] and DATA[name]["limit"] is None:  # the whole file: 1,460 rows
        assert DATA[name]["source"].endswith("math_1460.parquet")


@pytest.mark.slow
def test_evaluation_sets_and_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    def ev(name: str) -> dict[str, Any]:
        return OmegaConf.to_container(_setup(name, monkeypatch)[0].eval, resolve=True)

    r1 = ev("r1_distill_1p5b")
    assert r1["kind"] == "math" and r1["template"] == "messages"
    assert [r1["benchmarks"][b]["source"] for b in ("AIME24", "AIME25")] == [
        "/data/Sanity-Test-R1D-1.5B/test/aime_2024.parquet",
        "/data/Sanity-Test-R1D-1.5B/test/aime_2025.parquet",
    ]
    assert ev("qwen_math_1p5b")["kind"] == "math"
    for tool in ("python_tool_qwen7b", "python_tool_qwen3_30b_a3b"):
        assert ev(tool)["kind"] == "episodes"  # tool settings evaluate as tool episodes
        assert ev(tool)["benchmarks"]["AIME25"] == {"data_path": "/data/aime25.jsonl"}
    alf = ev("alfworld_qwen7b")
    assert alf["kind"] == "episodes" and alf["benchmarks"] == {
        "seen": {"data_dir": "/alfworld/json_2.1.1/valid_seen", "num_games": None},
        "unseen": {"data_dir": "/alfworld/json_2.1.1/valid_unseen", "num_games": None},
    }


# Reference variants -> frlab sweep arms (ablation=NAME), and what each must set.
def _arms(sweep: str) -> dict[str, tuple[Any, Any]]:
    """Each job of the sweep as Hydra's sweeper runs it (FRLAB_DATA_DIR=/data,
    ALFWORLD_DATA=/alfworld): its arm -> (resolved config, plan)."""
    out = {}
    for job in sweep_jobs(sweep):
        arm = next(o.split("=", 1)[1] for o in job.overrides if o.startswith("ablation="))
        out[arm] = (job.cfg, job.plan)
    return out


@pytest.mark.slow
def test_r1_and_qwen3_variants() -> None:
    r1 = _arms("r1_ablations")
    assert set(r1) == {"base", "delta_5e-3", "no_trust"}  # gate_5e3, no_trust
    assert r1["delta_5e-3"][1]["objective.sequence_bernoulli_kl.delta"] == pytest.approx(
        5e-3
    ) and math.isinf(r1["no_trust"][1]["objective.sequence_bernoulli_kl.delta"])
    qwen3 = _arms("qwen3_tool_ablations")
    assert math.isinf(qwen3["no_trust"][1]["objective.sequence_bernoulli_kl.delta"])
    no_is = qwen3["no_is"]
    assert no_is[1]["objective.trust_region"] == "no_is"
    assert no_is[0].objective.sequence_bernoulli_kl.delta == pytest.approx(1e-3)


@pytest.mark.slow
def test_qwen_math_variants() -> None:
    arms = _arms("qwen_math_ablations")
    # gate_1e3, negative_q09, negative_q02, five_benchmark_eval16
    assert {a: (delta(p), q(p)) for a, (_, p) in arms.items()} == {
        "delta_1e-3": (pytest.approx(1e-3), 1.0),
        "q0p9_delta_1e-3": (pytest.approx(1e-3), 0.9),
        "q0p2_delta_1e-3": (pytest.approx(1e-3), 0.2),
        "five_benchmark_eval16": (pytest.approx(3e-3), 1.0),
    }
    ev = OmegaConf.to_container(arms["five_benchmark_eval16"][0].eval, resolve=True)
    assert set(ev["benchmarks"]) == {"MATH500", "AMC23", "Minerva", "AIME25", "OlympiadBench"}
    assert (ev["k"], ev["sampling"]["temperature"], ev["sampling"]["top_p"]) == (16, 0.7, 0.7)


@pytest.mark.slow
def test_tool_and_alfworld_variants() -> None:
    tool = _arms("qwen7b_tool_ablations")
    assert [q(tool[a][1]) for a in ("q0p9", "q0p2", "q0p0")] == [0.9, 0.2, 0.0]
    assert tool["token_mean"][1]["objective.aggregation"] == "token_mean"
    const = tool["constant_length"][1]
    assert const["objective.aggregation"] == "constant_length"
    assert component_params(const, "constant_length") == {"length": 6144}
    alf = _arms("alfworld_ablations")
    assert q(alf["q0p2"][1]) == 0.2 and alf["no_is"][1]["objective.trust_region"] == "no_is"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sweep", "arm", "setting", "prompts", "samples", "episodes"),
    [
        ("qwen7b_tool_ablations", "grpo_32x4_no_std", "python_tool_qwen7b", 32, 4, 17),
        ("alfworld_ablations", "grpo_8x8", "alfworld_qwen7b", 8, 8, 3),
    ],
)
def test_grpo_arms_are_the_papers_grpo(
    sweep: str,
    arm: str,
    setting: str,
    prompts: int,
    samples: int,
    episodes: int,
) -> None:
    """PPO clip 0.2 / 0.2, token-mean reduction, no std whitening, G samples of B / G prompts
    (the same B), the same one-pass asynchronous pipeline; the lr schedule spans the reference
    GRPO arm's own update count."""
    _, grpo = _arms(sweep)[arm]
    ref = REFERENCE[setting]
    assert components(grpo) == {
        "baseline": "group_mean",
        "trust_region": "ppo_clip",
        "aggregation": "token_mean",
        "token_filter": "none",
    }
    assert component_params(grpo, "ppo_clip") == {"eps_low": 0.2, "eps_high": 0.2}
    assert (grpo["data.batch_size"], grpo["rollout.samples_per_prompt"]) == (ref["B"], samples)
    assert grpo["data.batch_size"] // grpo["rollout.samples_per_prompt"] == prompts
    assert (
        grpo["rollout.mode"] == "async" and grpo["rollout.max_policy_lag"] == REFERENCE_LAG[setting]
    )
    assert grpo["schedule_length"] == reference_updates({**ref, "episodes": episodes}, prompts)
    assert grpo["trainer.max_steps"] == STOPS[setting]


REFERENCE_LAG = {"python_tool_qwen7b": 4, "alfworld_qwen7b": 4}


def test_a_schedule_shorter_than_the_run_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from frlab.config.errors import ConfigError

    with pytest.raises(ConfigError, match="optim.schedule_steps"):
        _setup("python_tool_qwen7b", monkeypatch, "optim.schedule_steps=500")
    _, plan = _setup("python_tool_qwen7b", monkeypatch, "optim.schedule_steps=null")
    assert (
        plan["schedule_length"] == plan["trainer.max_steps"] == 600
    )  # null: the schedule spans the run
    assert "lr         : 1e-06 cosine over 600 updates (warm-up 3%, floor 10%)" in format_plan(plan)
    _, plan = _setup("python_tool_qwen7b", monkeypatch)
    assert "cosine over 3944 updates (warm-up 3%, floor 10%); the run stops at step 600" in (
        format_plan(plan)
    )
