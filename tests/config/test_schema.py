"""The declarations (frlab.config.schema) and what is derived from them: value rules, the
trainer's arguments, run-folder names, the search path."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from frlab.config import schema
from frlab.config.compose import run_suffix, safe_name, sweep_subdir
from frlab.config.declare import Meta, check_value, check_values, not_args
from frlab.config.errors import ConfigError
from frlab.config.schema import TrainerConfig
from frlab.data.batch import world_size

# The trainer defaults that are frlab's, not Lightning's (an endless rollout stream, the CPU).
FRLAB_DEFAULTS = (
    "max_steps",
    "accelerator",
    "devices",
    "precision",
    "log_every_n_steps",
    "val_check_interval",
    "check_val_every_n_epoch",
    "limit_val_batches",
    "num_sanity_val_steps",
    "enable_model_summary",
    "deterministic",
)


def trainer_keys() -> tuple[str, ...]:
    """Every lightning.Trainer argument: the declared ones and the refused ones."""
    declared = [f.name for f in dataclasses.fields(TrainerConfig) if f.name != "_target_"]
    return tuple(declared) + tuple(TrainerConfig.REFUSED)


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


def test_check_value_ranges_choices_and_pairs() -> None:
    meta = Meta(low=0.0, high=1.0, high_open=True)
    check_value("k", 0.0, meta)
    check_value("k", 0, meta)  # an int is a number
    for bad in (1.0, -0.1, float("nan")):
        with pytest.raises(ConfigError, match="`k`"):
            check_value("k", bad, meta)
    with pytest.raises(ConfigError, match=r"must be in \[0, 1\), got 1"):
        check_value("k", 1, meta)
    with pytest.raises(ConfigError) as info:
        check_value("mode", "asynch", Meta(choices=("async", "sync")))
    assert info.value.suggestions[0] == "async"
    check_value("betas", [0.9, 0.99], Meta(pair=True, low=0.0, high=1.0))
    with pytest.raises(ConfigError, match="two numbers"):
        check_value("betas", [0.9], Meta(pair=True))
    with pytest.raises(ConfigError, match=r"`betas\[1\]`"):
        check_value("betas", [0.9, 1.5], Meta(pair=True, low=0.0, high=1.0))


def test_check_values_walks_nested_sections_and_skips_null() -> None:
    values = {"batch_size": 0, "micro_batch_size": 4, "max_tokens_per_micro_batch": None}
    with pytest.raises(ConfigError) as info:
        check_values("data", values, schema.DataConfig)
    assert info.value.key == "data.batch_size"
    check_values("data", {**values, "batch_size": 8}, schema.DataConfig)
    with pytest.raises(ConfigError) as info:  # nested sections are checked too
        check_values("rollout", {"sampling": {"top_p": 0.0}}, schema.RolloutConfig)
    assert info.value.key == "rollout.sampling.top_p"


def test_a_config_not_composed_by_hydra_is_checked_by_omegaconf_against_the_declarations() -> None:
    """`structured` merges a hand-built config onto the declarations: unknown keys (close
    matches suggested, nested engine nodes included), wrong types and nulls are ConfigErrors
    naming the key; a key it leaves out takes its declared default."""
    from omegaconf import OmegaConf

    from frlab.config.compose import compose
    from frlab.config.preflight import preflight, structured

    plain = OmegaConf.to_container(compose([], with_hydra=False), resolve=False)
    del plain["data"]["pack_sequences"]
    cfg = structured(OmegaConf.create(plain))
    assert cfg.data.pack_sequences is True and OmegaConf.get_type(cfg.rollout.engine).__name__ == (
        "TorchEngineConfig"
    )
    assert preflight(OmegaConf.create(plain))["rollout.engine"] == "torch"
    for change, key, fragment in [
        ({"data": {"batch_sise": 2}}, "data.batch_sise", "'batch_size'"),
        (
            {"rollout": {"engine": {"max_batch_sise": 2}}},
            "rollout.engine.max_batch_sise",
            "'max_batch_size'",
        ),
        ({"optim": {"lr": "fast"}}, "optim.lr", "Float"),
        ({"data": {"batch_size": None}}, "data.batch_size", "Incompatible value 'None'"),
        ({"sead": 1}, "sead", "'seed'"),
    ]:
        with pytest.raises(ConfigError) as info:
            structured(OmegaConf.merge(OmegaConf.create(plain), change))
        assert info.value.key == key and fragment in str(info.value), str(info.value)


def test_keys_frlab_reads_itself_are_not_target_arguments() -> None:
    assert not_args(schema.OptimConfig) == (
        "grad_clip",
        "scheduler",
        "warmup_ratio",
        "min_lr_ratio",
        "schedule_steps",
        "skip_zero_signal_steps",
    )
    assert set(not_args(schema.ModelConfig)) == {
        "tokenizer",
        "logprob_chunk_size",
        "routing_replay",
        "compile",
    }
    assert not_args(schema.DataConfig) == (
        "micro_batch_size",
        "max_tokens_per_micro_batch",
        "pack_sequences",
    )


@pytest.mark.parametrize(
    ("devices", "nodes", "world"),
    [(1, 1, 1), (4, 2, 8), ([0, 1, 2], 1, 3), ("auto", 1, 1), ("2", 1, 2)],
)
def test_world_size(devices: object, nodes: int, world: int) -> None:
    assert world_size({"devices": devices, "num_nodes": nodes}) == world


def test_world_size_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="trainer.devices"):
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


@pytest.mark.slow
def test_the_declarations_are_no_group_of_the_help() -> None:
    """`python -m frlab --help` lists frlab's config groups, not the declarations Hydra holds
    (registered under root-level names, not in a group)."""
    import subprocess
    import sys

    from frlab.config.compose import REPO_ROOT

    out = subprocess.run(
        [sys.executable, "-m", "frlab", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    groups = out.stdout.split("== Config ==")[0]
    engines = sorted(p.stem for p in (REPO_ROOT / "configs/rollout/engine").glob("*.yaml"))
    assert {"remote", "torch", "torch_process", "vllm"} <= set(engines)
    assert f"rollout/engine: {', '.join(engines)}" in groups, groups
    assert "frlab_" not in groups, groups


def test_search_path_plugin_is_registered_idempotently() -> None:
    from hydra.core.plugins import Plugins
    from hydra.plugins.search_path_plugin import SearchPathPlugin

    from frlab.config.compose import FrlabSearchPathPlugin, setup_hydra

    setup_hydra()
    setup_hydra()
    found = [p for p in Plugins.instance().discover(SearchPathPlugin) if p is FrlabSearchPathPlugin]
    assert len(found) == 1


@pytest.mark.slow
def test_every_engine_declaration_is_an_option_and_every_option_an_engine() -> None:
    """The rollout/engine group is the list of engines: each declaration of
    frlab.config.schema.ENGINES (the keys of frlab's built-in engine nodes) is one of its
    options, and every option builds a subclass of Engine (one added as a folder and its option
    file, docs/extending.md, has no declaration: its option file holds its keys)."""
    from frlab.config.compose import compose, group_options
    from frlab.config.preflight import locate_engine
    from frlab.config.schema import ENGINES
    from frlab.rollout.engine import Engine

    options = group_options("rollout/engine")
    assert set(ENGINES) <= set(options), sorted(set(ENGINES) - set(options))
    for name in options:
        rollout = compose([f"rollout/engine={name}"], with_hydra=False).rollout
        assert issubclass(locate_engine(rollout), Engine), name
