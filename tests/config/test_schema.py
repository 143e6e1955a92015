"""Field specs, trainer argument names, run-folder resolvers, the search path."""

from __future__ import annotations

import inspect

import pytest

from frlab.config import schema
from frlab.config.errors import ConfigError
from frlab.config.resolvers import run_suffix, safe_name, sweep_subdir


def test_trainer_keys_match_the_installed_lightning() -> None:
    import lightning

    params = set(inspect.signature(lightning.Trainer.__init__).parameters) - {"self"}
    assert set(schema.TRAINER_KEYS) == params


def test_check_value_types_and_bounds() -> None:
    spec = schema.Field("float", low=0.0, high=1.0, high_open=True)
    schema.check_value("k", 0.0, spec)
    schema.check_value("k", 0, spec)  # an int is a number
    for bad in (1.0, -0.1, float("nan"), True, "0.5", None):
        with pytest.raises(ConfigError, match="`k`"):
            schema.check_value("k", bad, spec)
    schema.check_value("k", None, schema.Field("str", optional=True))
    with pytest.raises(ConfigError, match="integer"):
        schema.check_value("k", False, schema.Field("int"))


def test_check_section_unknown_and_missing_keys() -> None:
    fields = {"a": schema.Field("int"), "b": schema.Field("str")}
    with pytest.raises(ConfigError, match="missing"):
        schema.check_section("s", {"a": 1}, fields)
    with pytest.raises(ConfigError) as info:
        schema.check_section("s", {"a": 1, "b": "x", "aa": 2}, fields)
    assert info.value.key == "s.aa" and info.value.suggestions == ["a"]


@pytest.mark.parametrize(
    ("devices", "nodes", "world"),
    [(1, 1, 1), (4, 2, 8), ([0, 1, 2], 1, 3), ("auto", 1, 1), ("2", 1, 2)],
)
def test_world_size(devices: object, nodes: int, world: int) -> None:
    assert schema.world_size({"devices": devices, "num_nodes": nodes}) == world


def test_world_size_rejects_nonsense() -> None:
    with pytest.raises(ConfigError, match="trainer.devices"):
        schema.world_size({"devices": "many"})


def test_run_folder_names() -> None:
    assert run_suffix("") == ""
    assert run_suffix("seed=1") == "_seed=1"
    assert sweep_subdir(3, "") == "job3"
    assert (
        sweep_subdir(3, "objective.trust_region=none,seed=1")
        == "objective.trust_region=none,seed=1"
    )
    assert "/" not in safe_name("model.name_or_path=/data/m")
    assert len(safe_name("x" * 1000)) <= 180


def test_search_path_plugin_is_registered_idempotently() -> None:
    from hydra.core.plugins import Plugins
    from hydra.plugins.search_path_plugin import SearchPathPlugin

    from frlab.config.searchpath import FrlabSearchPathPlugin, register_search_path

    register_search_path()
    register_search_path()
    found = [p for p in Plugins.instance().discover(SearchPathPlugin) if p is FrlabSearchPathPlugin]
    assert len(found) == 1
