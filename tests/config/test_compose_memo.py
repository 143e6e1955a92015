"""`compose` copies a config it composed before for the same call: every call gets its own
copy, and an edited config file, another working folder or a newly registered engine
declaration composes afresh."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from frlab.config import compose as compose_module
from frlab.config import schema
from frlab.config.compose import compose

ROOT = Path(__file__).resolve().parents[2]


def test_each_call_gets_its_own_copy() -> None:
    first = compose(["experiment=toy_cpu"])
    first.trainer.max_steps = 7
    again = compose(["experiment=toy_cpu"])
    assert again.trainer.max_steps == 300 and again is not first
    assert compose(["experiment=toy_cpu", "trainer.max_steps=9"]).trainer.max_steps == 9


def test_an_edited_config_file_composes_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configs, experiments = tmp_path / "configs", tmp_path / "experiments"
    shutil.copytree(ROOT / "configs", configs)
    shutil.copytree(ROOT / "experiments" / "experiment", experiments / "experiment")
    monkeypatch.setattr(compose_module, "CONFIGS_DIR", configs)
    monkeypatch.setattr(compose_module, "EXPERIMENTS_DIR", experiments)
    assert compose(["experiment=toy_cpu"]).trainer.max_steps == 300
    preset = experiments / "experiment" / "toy_cpu.yaml"
    preset.write_text(preset.read_text().replace("max_steps: 300", "max_steps: 301"))
    assert compose(["experiment=toy_cpu"]).trainer.max_steps == 301
    monkeypatch.chdir(tmp_path)
    assert compose(["experiment=toy_cpu"]).hydra.runtime.cwd == str(tmp_path)


def test_a_newly_registered_engine_declaration_is_stored_and_composed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = compose(["rollout/engine=torch"]).rollout.engine
    torch_cls = schema.ENGINES["torch"]
    fields = [(f.name, f.type, f) for f in dataclasses.fields(torch_cls)]
    extra = dataclasses.make_dataclass("TorchPlus", [*fields, ("extra_knob", int, 5)])
    monkeypatch.setitem(schema.ENGINES, "torch", extra)
    after = compose(["rollout/engine=torch"]).rollout.engine
    assert "extra_knob" not in before and after.extra_knob == 5
