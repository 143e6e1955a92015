"""Group option files only choose and override: a value a file sets differs from the default
its key is declared with (the schema for the typed sections, the constructor for `env`), so
each default has one home and cannot drift apart from a copy."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra.utils import get_object

from frlab.config import schema
from frlab.config.compose import CONFIGS_DIR, EXPERIMENTS_DIR
from frlab.config.declare import declared, default_of, section_type
from frlab.config.schema import ENGINES

# Files that pin declared defaults on purpose, with the reason.
PINNED = {
    "optim/paper.yaml": "the paper's reference optimiser: a change of frlab's defaults must not "
    "change a paper setting",
}
# Env options whose value is the option's choice, not the constructor's default.
ENV_CHOICES = {
    "math.yaml": {"source"},
    "toy_multi.yaml": {"num_decoys"},
    "toy_single.yaml": {"num_digits"},
}


def options(group: str) -> list[Path]:
    return sorted((CONFIGS_DIR / group).glob("*.yaml"))


def restated(values: Mapping[str, Any], cls: type, prefix: str) -> Iterator[str]:
    """Full keys whose value equals the default declared in `cls`."""
    fields = {f.name: (f, a) for f, a in declared(cls)}
    for key, value in values.items():
        if key == "defaults" or key not in fields:
            continue
        f, annotation = fields[key]
        sub = section_type(annotation)
        if sub is not None and isinstance(value, Mapping):
            yield from restated(value, sub, f"{prefix}.{key}")
        elif (
            (default := default_of(f)) is not dataclasses.MISSING
            and value == default
            and (
                type(value)
                is type(default)  # 1 == True, but an int for a bool key is no restatement
            )
        ):
            yield f"{prefix}.{key}"


SECTIONS = [
    (group, path)
    for group in ("model", "rollout", "data", "optim", "trainer", "paths")
    for path in options(group)
    if f"{group}/{path.name}" not in PINNED
]


def test_the_pinned_options_exist() -> None:
    assert all((CONFIGS_DIR / name).is_file() for name in PINNED), PINNED


@pytest.mark.parametrize(("group", "path"), SECTIONS, ids=[f"{g}/{p.name}" for g, p in SECTIONS])
def test_a_section_option_restates_no_declared_default(group: str, path: Path) -> None:
    values = yaml.safe_load(path.read_text()) or {}
    section = section_type(dict((f.name, a) for f, a in declared(schema.FrlabConfig))[group])
    assert section is not None
    found = list(restated(values, section, group))
    assert not found, f"{group}/{path.name} restates declared defaults: {found}"


DECLARED_ENGINES = [p for p in options("rollout/engine") if p.stem in ENGINES]


@pytest.mark.parametrize("path", DECLARED_ENGINES, ids=lambda p: p.name)
def test_an_engine_option_restates_no_declared_default(path: Path) -> None:
    """frlab's declared engines; an engine added as one folder and its option file
    (docs/extending.md) has no declaration: its option file holds its keys."""
    values = yaml.safe_load(path.read_text()) or {}
    found = list(restated(values, ENGINES[path.stem], "rollout.engine"))
    assert not found, f"rollout/engine/{path.name} restates declared defaults: {found}"


@pytest.mark.parametrize("path", options("env"), ids=lambda p: p.name)
def test_an_env_option_holds_its_constructors_defaults(path: Path) -> None:
    """An env option lists constructor arguments (so `env.KEY=V` needs no `+`) with the
    constructor's own defaults: `python -m frlab env=NAME` builds what `Class()` builds."""
    values = yaml.safe_load(path.read_text())
    params = inspect.signature(get_object(values.pop("_target_"))).parameters
    differ = {}
    for key, value in values.items():
        assert key in params, f"env/{path.name}: {key!r} is not an argument of the class"
        default = params[key].default
        interpolated = isinstance(value, str) and value.startswith("${")
        if not interpolated and value != default and key not in ENV_CHOICES.get(path.name, ()):
            differ[key] = (value, default)
    assert not differ, f"env/{path.name} (value, constructor default): {differ}"


# Presets that state a paper setting in full on purpose: a change of frlab's defaults must not
# change what they reproduce.
PAPER_PRESETS = {
    "experiment/alfworld_qwen7b.yaml",
    "experiment/python_tool_qwen3_30b_a3b.yaml",
    "experiment/python_tool_qwen7b.yaml",
    "experiment/qwen_math_1p5b.yaml",
    "experiment/r1_distill_1p5b.yaml",
    "experiment/smollm2_gsm8k_cpu.yaml",  # the paper's optimiser and sampling on a CPU model
    "ablation/grpo_8x8.yaml",
    "ablation/grpo_32x4_no_std.yaml",  # the reference's GRPO arm
}
PRESETS = [*sorted(EXPERIMENTS_DIR.glob("experiment/*.yaml")), *options("ablation")]
CHANGE_ONLY = [p for p in PRESETS if f"{p.parent.name}/{p.name}" not in PAPER_PRESETS]


def test_the_paper_presets_exist() -> None:
    names = {f"{p.parent.name}/{p.name}" for p in PRESETS}
    assert PAPER_PRESETS <= names, PAPER_PRESETS - names


@pytest.mark.parametrize("path", CHANGE_ONLY, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_preset_restates_no_declared_default_unless_it_states_a_paper_setting(
    path: Path,
) -> None:
    """Experiment and ablation presets (`# @package _global_`) only change values; a paper
    preset states its setting in full (PAPER_PRESETS, left out of this test)."""
    values = yaml.safe_load(path.read_text()) or {}
    found = [key.lstrip(".") for key in restated(values, schema.FrlabConfig, "")]
    assert not found, f"{path.parent.name}/{path.name} restates declared defaults: {found}"
