"""Hydra's composition errors (unknown keys, wrong types, unknown group options) come back as
ConfigErrors naming the key, with close matches, from compose() as from `python -m frlab`."""

from __future__ import annotations

import re

import pytest

from frlab.config.compose import compose, group_options
from frlab.config.errors import ConfigError
from frlab.config.preflight import preflight


def composition_error(overrides: list[str]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        compose(overrides)
    return info.value


def test_group_options_list_the_yaml_files() -> None:
    assert {"flashreinforce", "pg_is", "grpo", "dr_grpo", "rloo"} <= set(group_options("objective"))
    assert {"csv", "tensorboard", "wandb"} <= set(group_options("logger"))
    assert group_options("rollout/engine") == ["remote", "torch", "torch_process", "vllm"]
    assert "toy_cpu" in group_options("experiment")
    assert group_options("not_a_group") == []


@pytest.mark.parametrize(
    ("args", "key", "suggestion"),
    [
        (["objective=flashreinforse"], "objective", "flashreinforce"),
        (["experiment=toy_cpus"], "experiment", "toy_cpu"),
        (["logger=tensorbord"], "logger", "tensorboard"),
        (["sweep=r1_ablation"], "sweep", "r1_ablations"),
        (["rollout/engine=vlm"], "rollout.engine", "vllm"),
        (["rollout.max_inflight=3"], "rollout.max_inflight", "max_in_flight"),
        (["trainer.max_step=3"], "trainer.max_step", "max_steps"),
        (["rollout.sampling.temprature=1"], "rollout.sampling.temprature", "temperature"),
        (
            ["objective.sequence_bernouli_kl.delta=1"],
            "objective.sequence_bernouli_kl",
            "sequence_bernoulli_kl",
        ),
        (["env.num_digit=3"], "env.num_digit", "num_digits"),
    ],
)
def test_typos_raise_with_suggestions(args: list[str], key: str, suggestion: str) -> None:
    err = composition_error(args)
    assert err.key == key, str(err)
    assert suggestion in err.suggestions, str(err)


def test_a_key_of_another_section_suggests_where_it_lives() -> None:
    """`rollout.temperature` is `rollout.sampling.temperature` (not max_turns, not a `+` key)."""
    err = composition_error(["rollout.temperature=0"])
    assert err.key == "rollout.temperature"
    assert err.suggestions == ["rollout.sampling.temperature"], str(err)
    assert "max_turns" not in str(err).split("(valid")[0] and "+rollout" not in str(err)


@pytest.mark.parametrize(
    ("args", "key", "fragment"),
    [
        (
            ["data.batch_size=abc"],
            "data.batch_size",
            "Value 'abc' of type 'str' could not be converted to Integer",
        ),
        (["data.batch_size=16.5"], "data.batch_size", "could not be converted to Integer"),
        (["dry_run=maybe"], "dry_run", "is not a valid bool"),
        (["optim.lr=fast"], "optim.lr", "could not be converted to Float"),
        (["data.batch_size=null"], "data.batch_size", "is not Optional"),
        (["~data.micro_batch_size"], "data.micro_batch_size", "does not support deletion"),
        (["rollout.sampling=3"], "rollout.sampling", "SamplingConfig"),
        (["trainer.gradient_clip_val=1.0"], "trainer.gradient_clip_val", "optim.grad_clip"),
        (["rollout.remote.servers=[http://a:1]"], "rollout.remote.servers", "not in struct"),
        (["env=math", "env.options.min_terms=2"], "env.options.min_terms", "not in struct"),
    ],
)
def test_wrong_values_name_the_key(args: list[str], key: str, fragment: str) -> None:
    """Hydra's and OmegaConf's own words, with the key named."""
    err = composition_error(args)
    assert err.key == key, str(err)
    assert fragment in str(err), str(err)


@pytest.mark.slow
def test_valid_overrides_compose() -> None:
    compose(["experiment=r1_distill_1p5b", "model.name_or_path=/x", "trainer.max_time=1"])
    compose(["~logger", "~callbacks.model_checkpoint", "hydra/launcher=basic"])
    compose(["objective=grpo", "objective.ppo_clip.eps_high=0.3"])
    cfg = compose(["env=math", "env.options={min_terms: 2, max_terms: 3}", "env.seed=4"])
    assert dict(cfg.env.options) == {"min_terms": 2, "max_terms": 3} and cfg.env.seed == 4
    assert compose(["trainer.max_time=00:01:00:00"]).trainer.max_time == "00:01:00:00"


def test_a_plus_on_a_declared_key_is_hydras_error_naming_it() -> None:
    """Every Lightning argument is declared: `trainer.X=...` sets it; `+` adds a new key only."""
    assert compose(["trainer.detect_anomaly=true"]).trainer.detect_anomaly is True
    for key in ("trainer.detect_anomaly", "rollout.max_len"):
        err = composition_error([f"+{key}=3"])
        assert err.key == key and "An item is already at" in str(err), str(err)


def test_the_engine_is_a_group_and_a_plain_key_names_it() -> None:
    """`rollout/engine=vllm` chooses the engine; a name where its node belongs (a preset's
    `engine: vllm`, `rollout.engine=vllm` on the command line) is refused, naming the group."""
    node = compose(["rollout/engine=vllm"]).rollout.engine
    assert node._target_ == "frlab.rollout.vllm.engine.VLLMEngine.for_policy"
    for value, fragment in (
        ("vllm", "rollout/engine=vllm on the command line"),
        ("torhc", "did you mean 'torch'"),
    ):
        with pytest.raises(ConfigError, match="override /rollout/engine") as info:
            preflight(compose([f"rollout.engine={value}"]))
        assert info.value.key == "rollout.engine" and fragment in str(info.value), value


@pytest.mark.slow
def test_a_bool_key_accepts_only_booleans() -> None:
    """OmegaConf would turn `data.pack_sequences=3` into True silently: preflight reads the
    job's overrides as written."""
    for bad in ("3", "1", "yes"):
        with pytest.raises(ConfigError, match="data.pack_sequences.*true or false"):
            preflight(compose([f"data.pack_sequences={bad}"]))
    assert preflight(compose(["data.pack_sequences=false"]))["data.pack_sequences"] is False
    assert compose(["model.lora.rank=4"]).model.lora.rank == 4  # not a bool key: untouched


def job(overrides: list[str]):  # noqa: ANN201
    """A composed config whose job overrides (what a sweep hands each job) are `overrides`."""
    cfg = compose([])
    cfg.hydra.overrides.task = overrides
    return cfg


@pytest.mark.parametrize(
    "override",
    [
        "data.pack_sequences=3",
        "rollout.engine.packed_prefill=3",
        "rollout.remote.nccl_packed=1",
        "eval.at_start=1",
    ],
)
def test_preflight_checks_the_jobs_own_overrides_on_bool_keys(override: str) -> None:
    """The values a sweep preset hands a job are its overrides (`hydra.overrides.task`); the
    keys of the nodes typed by the option chosen (engine, fleet, eval) are held to booleans as
    the root's are."""
    with pytest.raises(ConfigError, match=f"{override.split('=')[0]}.*got {override[-1]}"):
        preflight(job([override]))


@pytest.mark.parametrize(
    ("sweep", "shown"),
    [
        ("false,3", "3"),
        ("range(0,2)", "0"),
        ("choice(true,yes)", "yes"),
        ("interval(0,1)", "interval(0,1)"),
    ],
)
def test_every_value_of_a_sweep_on_a_bool_key_is_a_boolean(sweep: str, shown: str) -> None:
    """`-m data.pack_sequences=false,3` would run a job with 3 read as true."""
    with pytest.raises(ConfigError, match=f"data.pack_sequences.*got {re.escape(shown)}$"):
        preflight(job([f"data.pack_sequences={sweep}"]))
    preflight(job(["data.pack_sequences=true,false", "seed=0,1"]))
    preflight(job(["data.pack_sequences=${oc.env:PACK,true}"]))  # resolves later


def test_call_hydra_main_reports_config_errors_and_keeps_other_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hydra re-raises (HYDRA_FULL_ERROR=1, whatever the user set); a config error exits 2,
    Hydra's own short errors keep its message and exit 1, anything else is re-raised."""
    import os

    from hydra.errors import SearchPathException

    from frlab.config.compose import call_hydra_main

    def fails(exc: Exception):  # noqa: ANN202
        def hydra_main() -> None:
            assert os.environ["HYDRA_FULL_ERROR"] == "1"
            raise exc

        return hydra_main

    monkeypatch.setenv("HYDRA_FULL_ERROR", "0")
    with pytest.raises(SystemExit) as info:
        call_hydra_main(fails(ConfigError("seed", "must be an int")))
    assert info.value.code == 2
    assert capsys.readouterr().err == "frlab: config error: config key `seed`: must be an int\n"
    with pytest.raises(SystemExit) as info:
        call_hydra_main(fails(SearchPathException("Additional config directory '/x' not found")))
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("Additional config directory '/x' not found\n") and "HYDRA_FULL" in err
    with pytest.raises(RuntimeError, match="boom"):
        call_hydra_main(fails(RuntimeError("boom")))
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # the user asked for Hydra's full report
    with pytest.raises(SearchPathException):
        call_hydra_main(fails(SearchPathException("Additional config directory '/x' not found")))


def test_frlab_imports_no_hydra_internals() -> None:
    """Errors are reported through Hydra's documented behaviour (call_hydra_main), with no
    function of Hydra's replaced: nothing in frlab reaches into `hydra._internal`."""
    from pathlib import Path

    import frlab

    root = Path(frlab.__file__).parent
    used = [
        str(p.relative_to(root)) for p in root.rglob("*.py") if "hydra._internal" in p.read_text()
    ]
    assert used == []


def test_a_mapping_given_to_a_null_mapping_key_names_the_key() -> None:
    """OmegaConf cannot merge `KEY={...}` into a typed mapping that is null (it raises a bare
    AttributeError carrying the key): a config error at that key. `rollout.vllm_engine_args`
    is an empty mapping by default: a new key of it takes a `+`."""
    with pytest.raises(ConfigError) as info:
        compose(["model=hf", "model.name_or_path=null", "model.config={model_type: llama}"])
    assert info.value.key == "model.config"
    cfg = compose(["+rollout.vllm_engine_args.gpu_memory_utilization=0.4"])
    assert cfg.rollout.vllm_engine_args == {"gpu_memory_utilization": 0.4}
    with pytest.raises(ConfigError) as info:
        compose(["rollout.vllm_engine_args={gpu_memory_utilization: 0.4}"])
    assert info.value.key == "rollout.vllm_engine_args.gpu_memory_utilization", str(info.value)
