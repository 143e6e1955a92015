"""frlab.config.availability: every dataset file, game folder and model source a run needs is
checked before anything heavy, as a ConfigError naming the key (before: a missing evaluation
set was a raw FileNotFoundError at the first evaluation, step 50)."""

from __future__ import annotations

from pathlib import Path

import pytest

from frlab.config.availability import check_availability, model_source_problem, problems
from frlab.config.compose import compose
from frlab.config.errors import ConfigError


def _keys(overrides: list[str]) -> list[str]:
    return [key for key, _ in problems(compose(overrides, with_hydra=False))]


def test_the_default_toy_run_needs_nothing_that_is_missing() -> None:
    check_availability(compose([], with_hydra=False))


def test_a_missing_math_evaluation_file_names_its_benchmark(tmp_path: Path) -> None:
    missing = tmp_path / "aime24.jsonl"
    cfg = compose(["eval=math", f"+eval.benchmarks.AIME24={missing}"], with_hydra=False)
    with pytest.raises(ConfigError) as info:
        check_availability(cfg)
    assert info.value.key == "eval.benchmarks.AIME24" and str(missing) in str(info.value)
    missing.write_text('{"question": "1+1?", "answer": "2"}\n')
    check_availability(cfg)


def test_a_hub_dataset_that_is_not_cached_offline_is_reported(monkeypatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", "/nonexistent-hf-home")
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    keys = _keys(["eval=math_tool"])  # AMC23 and Minerva come from the hub, AIME25 ships offline
    assert keys == ["eval.benchmarks.AMC23", "eval.benchmarks.Minerva"]


def test_a_missing_training_dataset_names_env_source(tmp_path: Path) -> None:
    assert _keys(["env=math", f"env.source={tmp_path / 'train.jsonl'}"]) == ["env.source"]


def test_episode_benchmarks_and_the_training_game_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    games = tmp_path / "train"
    assert _keys(["env=alfworld", f"env.data_dir={games}", "eval=alfworld"]) == [
        "env.data_dir", "eval.benchmarks.seen.data_dir", "eval.benchmarks.unseen.data_dir",
    ]  # fmt: skip
    game = games / "pick_apple" / "trial_1"
    game.mkdir(parents=True)
    (game / "game.tw-pddl").write_text("{}")
    (game / "traj_data.json").write_text("{}")
    assert _keys(["env=alfworld", f"env.data_dir={games}"]) == []


def test_a_python_tool_task_file_must_exist(tmp_path: Path) -> None:
    assert _keys(["env=python_tool", f"env.data_path={tmp_path / 'tasks.jsonl'}"]) == [
        "env.data_path"
    ]


def test_model_sources(tmp_path: Path, monkeypatch) -> None:
    assert model_source_problem(None) is None and model_source_problem("toy") is None
    assert model_source_problem(str(tmp_path)) is None  # an existing folder
    assert "not an existing model folder" in model_source_problem(str(tmp_path / "nope"))
    assert "GGUF file not found" in model_source_problem(f"gguf:{tmp_path / 'm.gguf'}")
    assert model_source_problem("gguf:smollm2-135m-instruct") is None  # fetched on first use
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    assert "not in the Hugging Face cache" in model_source_problem("org/not-cached-model")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")
    assert model_source_problem("org/not-cached-model") is None  # online: it can download


def test_a_preset_whose_model_is_not_cached_fails_on_model_name_or_path(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ALFWORLD_DATA", "/nonexistent-alfworld")
    keys = _keys(["experiment=alfworld_qwen7b"])
    assert keys[0] == "model.name_or_path" and "env.data_dir" in keys
