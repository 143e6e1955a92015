"""Before a real run: devices, model sources, data files and what each environment reads are
checked first, fast, offline, each problem naming its key and pointing to dry_run=true (before:
a missing evaluation set was a raw FileNotFoundError at the first evaluation, step 50)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from frlab.config.compose import compose
from frlab.config.errors import ConfigError
from frlab.config.preflight import preflight
from frlab.model import hub
from frlab.run import machine
from frlab.run.machine import check_machine, data_problems


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "GPU_DEVICE_FILES", ("/nonexistent/nvidia0",))
    monkeypatch.setattr(machine.platform, "system", lambda: "Linux")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def machine_error(overrides: list[str]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        check_machine(compose(overrides))
    return info.value


@pytest.mark.parametrize("experiment", ["alfworld_qwen7b", "qwen_math_1p5b", "r1_distill_1p5b"])
def test_a_gpu_preset_on_a_cpu_machine_fails_on_the_device_and_points_to_dry_run(
    no_gpu: None, experiment: str
) -> None:
    err = machine_error([f"experiment={experiment}"])
    assert err.key == "trainer.accelerator"
    assert "no GPU" in str(err) and "dry_run=true" in str(err)


def test_gpu_use_outside_the_trainer_is_caught_too(no_gpu: None) -> None:
    assert machine_error(["rollout.device=cuda"]).key == "rollout.device"
    check_machine(compose([]))  # the CPU default needs nothing
    # vLLM beside a CPU learner is not refused by name: preflight asks the installed vLLM
    check_machine(compose(["rollout/engine=vllm"]))


def test_a_visible_gpu_passes_the_device_check(monkeypatch, tmp_path: Path) -> None:
    device = tmp_path / "nvidia0"
    device.write_text("")
    monkeypatch.setattr(machine, "GPU_DEVICE_FILES", (str(device),))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert machine.gpu_visible()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert not machine.gpu_visible()


def test_a_missing_model_folder_names_the_key_not_the_config_clash(tmp_path: Path) -> None:
    """On the toy default (which also sets model.config), a wrong path is reported as such."""
    missing = tmp_path / "no_such_model"
    with pytest.raises(ConfigError) as info:
        preflight(compose([f"model.name_or_path={missing}"]))
    assert info.value.key == "model.name_or_path"
    assert "not an existing folder" in str(info.value) and "not both" not in str(info.value)


def test_a_loadable_model_next_to_a_random_init_config_is_refused_at_model_config(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError) as info:
        preflight(compose([f"model.name_or_path={tmp_path}"]))
    assert info.value.key == "model.config" and "model=hf" in str(info.value)


def test_an_uncached_hub_model_offline_is_found_before_anything_loads(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(machine, "gpu_visible", lambda: True)
    monkeypatch.setattr(hub, "cached_on_hub", lambda repo: False)
    err = machine_error(["experiment=qwen_math_1p5b"])
    assert err.key == "model.name_or_path" and "local Hugging Face cache" in str(err)
    monkeypatch.setattr(hub, "cached_on_hub", lambda repo: repo == "Qwen/Qwen2.5-Math-1.5B")
    err = machine_error(["experiment=qwen_math_1p5b", "eval=none"])
    assert err.key == "env.source"  # the model is cached, the DAPO training set is not
    for flag in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(flag, "0")
    monkeypatch.setattr(hub, "cached_on_hub", lambda repo: False)
    check_machine(compose(["experiment=qwen_math_1p5b", "eval=none"]))  # online: downloadable


@pytest.mark.slow
def test_missing_data_files_name_their_keys(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(machine, "gpu_visible", lambda: True)
    monkeypatch.setenv("FRLAB_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(hub, "cached_on_hub", lambda repo: True)
    err = machine_error(["experiment=python_tool_qwen7b", "eval=none"])
    assert err.key == "env.data_path" and "dapo_math_7500_tool.jsonl" in str(err)
    (tmp_path / "dapo_math_7500_tool.jsonl").write_text("")
    err = machine_error(["experiment=python_tool_qwen7b", "eval=tool_episodes"])
    assert err.key == "eval.benchmarks.AMC23.data_path"
    err = machine_error(["env=math", f"env.source={tmp_path}/train.jsonl"])
    assert err.key == "env.source"
    err = machine_error(["eval=math", f"eval.benchmarks.GSM8K={tmp_path}/gsm8k.jsonl"])
    assert err.key == "eval.benchmarks.GSM8K"


def test_the_checks_import_neither_torch_nor_transformers() -> None:
    import subprocess

    code = (
        "import sys\n"
        "from frlab.config.compose import compose\n"
        "from frlab.run.machine import check_machine\n"
        "try:\n"
        "    check_machine(compose(['experiment=alfworld_qwen7b']))\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__)\n"
        "print(sorted(m for m in ('torch', 'transformers', 'lightning') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_benchmark_list_is_checked_entry_by_entry(tmp_path) -> None:
    """`eval.benchmarks` given as a list (Hydra's delete then add replaces the group's mapping):
    each entry's local file is checked under the name the evaluation gives it."""
    from frlab.run.machine import check_data_files

    present = tmp_path / "present.jsonl"
    present.write_text('{"question": "1+1", "answer": "2"}\n')
    listed = f"+eval.benchmarks=[{present},{{name: gone, source: {tmp_path}/gone.jsonl}}]"
    cfg = compose(["eval=math", "~eval.benchmarks", listed], with_hydra=False)
    with pytest.raises(ConfigError) as info:
        check_data_files(cfg)
    assert info.value.key == "eval.benchmarks.gone.source"


def _keys(overrides: list[str]) -> list[str]:
    return [key for key, _ in data_problems(compose(overrides, with_hydra=False))]


def test_the_default_toy_run_reads_nothing_that_is_missing() -> None:
    assert _keys([]) == []


def test_a_missing_math_evaluation_file_names_its_benchmark(tmp_path: Path) -> None:
    missing = tmp_path / "aime24.jsonl"
    cfg = compose(["eval=math", f"+eval.benchmarks.AIME24={missing}"], with_hydra=False)
    with pytest.raises(ConfigError) as info:
        check_machine(cfg)
    assert info.value.key == "eval.benchmarks.AIME24" and str(missing) in str(info.value)
    missing.write_text('{"question": "1+1?", "answer": "2"}\n')
    check_machine(cfg)


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
        "env.data_dir",
        "eval.benchmarks.seen.data_dir",
        "eval.benchmarks.unseen.data_dir",
    ]
    game = games / "pick_apple" / "trial_1"
    game.mkdir(parents=True)
    (game / "game.tw-pddl").write_text("{}")
    (game / "traj_data.json").write_text("{}")
    assert _keys(["env=alfworld", f"env.data_dir={games}"]) == []


def test_a_python_tool_task_file_must_exist(tmp_path: Path) -> None:
    assert _keys(["env=python_tool", f"env.data_path={tmp_path / 'tasks.jsonl'}"]) == [
        "env.data_path"
    ]


def test_a_preset_whose_model_is_not_cached_fails_on_model_name_or_path(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ALFWORLD_DATA", "/nonexistent-alfworld")
    monkeypatch.setattr(machine, "gpu_visible", lambda: True)
    monkeypatch.setattr(hub, "cached_on_hub", lambda repo: False)
    assert machine_error(["experiment=alfworld_qwen7b"]).key == "model.name_or_path"
    assert "env.data_dir" in _keys(["experiment=alfworld_qwen7b"])
