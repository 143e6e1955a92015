"""The declarations (frlab.config.schema) and what is derived from them: value rules, the
trainer's arguments, run-folder names, the search path, SCHEMA.md."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from frlab.config import schema
from frlab.config.declare import Field, check_declared, check_value, not_args
from frlab.config.errors import ConfigError
from frlab.config.resolvers import run_suffix, safe_name, sweep_subdir
from frlab.config.schema_trainer import FRLAB_DEFAULTS, TrainerConfig, trainer_keys, world_size


def test_trainer_keys_match_the_installed_lightning() -> None:
    import lightning

    params = set(inspect.signature(lightning.Trainer.__init__).parameters) - {"self"}
    assert set(trainer_keys()) == params


def test_trainer_defaults_are_lightnings_except_frlabs_own() -> None:
    import lightning

    params = inspect.signature(lightning.Trainer.__init__).parameters
    for f in dataclasses.fields(TrainerConfig):
        if f.name == "_target_" or f.name in FRLAB_DEFAULTS:
            continue
        assert f.default == params[f.name].default, f.name


def test_check_value_types_and_bounds() -> None:
    spec = Field("float", low=0.0, high=1.0, high_open=True)
    check_value("k", 0.0, spec)
    check_value("k", 0, spec)  # an int is a number
    for bad in (1.0, -0.1, float("nan"), True, "0.5", None):
        with pytest.raises(ConfigError, match="`k`"):
            check_value("k", bad, spec)
    check_value("k", None, Field("str", optional=True))
    with pytest.raises(ConfigError, match="integer"):
        check_value("k", False, Field("int"))


def test_check_declared_unknown_removed_and_nested_keys() -> None:
    values = {"batch_size": 8, "micro_batch_size": 4, "_target_": "x",
              "max_tokens_per_micro_batch": None, "pack_sequences": True}  # fmt: skip
    check_declared("data", values, schema.DataConfig)
    with pytest.raises(ConfigError, match="missing"):
        check_declared("data", {"batch_size": 8, "_target_": "x"}, schema.DataConfig)
    with pytest.raises(ConfigError) as info:
        check_declared("data", {**values, "batch_sise": 2}, schema.DataConfig)
    assert info.value.key == "data.batch_sise" and info.value.suggestions[0] == "batch_size"
    rollout = {f.name: None for f in dataclasses.fields(schema.RolloutConfig)}
    with pytest.raises(ConfigError) as info:  # nested sections are checked too
        check_declared("rollout", {**rollout, "sampling": {"temperature": 1.0}},
                       schema.RolloutConfig)  # fmt: skip
    assert info.value.key.startswith("rollout.")


def test_keys_frlab_reads_itself_are_not_target_arguments() -> None:
    assert not_args(schema.OptimConfig) == ("grad_clip", "scheduler", "warmup_ratio",
                                            "min_lr_ratio", "schedule_steps",
                                            "skip_zero_signal_steps")  # fmt: skip
    assert set(not_args(schema.ModelConfig)) == {"tokenizer", "logprob_chunk_size",
                                                 "routing_replay"}  # fmt: skip
    assert not_args(schema.DataConfig) == ("micro_batch_size", "max_tokens_per_micro_batch",
                                           "pack_sequences")  # fmt: skip


@pytest.mark.parametrize(
    ("devices", "nodes", "world"),
    [(1, 1, 1), (4, 2, 8), ([0, 1, 2], 1, 3), ("auto", 1, 1), ("2", 1, 2)],
)
def test_world_size(devices: object, nodes: int, world: int) -> None:
    assert world_size({"devices": devices, "num_nodes": nodes}) == world


def test_world_size_rejects_nonsense() -> None:
    with pytest.raises(ConfigError, match="trainer.devices"):
        world_size({"devices": "many"})


def test_run_folder_names_stay_short() -> None:
    assert run_suffix("") == ""
    long = ",".join(f"rollout.sampling.max_new_tokens={i}" for i in range(20))
    suffix = run_suffix(long)
    assert suffix.startswith("_") and len(suffix) == 7 and suffix == run_suffix(long)
    assert run_suffix("seed=1") != run_suffix("seed=2")
    assert sweep_subdir(3, "") == "job3"
    assert (
        sweep_subdir(3, "objective.trust_region=none,seed=1")
        == "objective.trust_region=none,seed=1"
    )
    assert sweep_subdir(3, long).startswith("job3_") and len(sweep_subdir(3, long)) == 11
    assert "/" not in safe_name("model.name_or_path=/data/m")


def test_search_path_plugin_is_registered_idempotently() -> None:
    from hydra.core.plugins import Plugins
    from hydra.plugins.search_path_plugin import SearchPathPlugin

    from frlab.config.searchpath import FrlabSearchPathPlugin, register_search_path

    register_search_path()
    register_search_path()
    found = [p for p in Plugins.instance().discover(SearchPathPlugin) if p is FrlabSearchPathPlugin]
    assert len(found) == 1


def test_schema_md_is_generated_from_the_declarations() -> None:
    """The committed frlab/config/SCHEMA.md equals `python -m frlab.config.schema_doc`'s."""
    from frlab.config.schema_doc import PATH, generate

    text = generate()
    assert PATH.read_text() == text, "run: python -m frlab.config.schema_doc"
    for key in ("`rollout.sampling.temperature`", "`env.options`", "`env.seed`", "`env.limit`",
                "`eval.benchmarks.NAME.options`", "`trainer.max_time`", "`user_modules`",
                "`rollout/engine`"):  # fmt: skip
        assert key in text, key


def test_every_engine_option_has_its_declaration() -> None:
    """The rollout/engine group's options and frlab.config.schema.ENGINES name the same
    engines: the group is the list, the declaration holds each node's keys."""
    from frlab.config.compose import group_options
    from frlab.config.schema import ENGINES

    assert sorted(ENGINES) == group_options("rollout/engine")
