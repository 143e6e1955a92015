"""Every class of config mistake is caught by preflight with a message naming the key."""

from __future__ import annotations

import pytest

from frlab.config.compose import compose
from frlab.config.errors import ConfigError
from frlab.config.preflight import preflight
from frlab.defaults import torch_engine


def fails(overrides: list[str], key: str, *fragments: str) -> ConfigError:
    """Assert preflight(compose(overrides)) raises a ConfigError at `key` mentioning fragments."""
    with pytest.raises(ConfigError) as info:
        preflight(compose(overrides))
    err = info.value
    assert err.key == key, str(err)
    assert f"`{key}`" in str(err)
    for fragment in fragments:
        assert fragment in str(err), str(err)
    return err


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


# -- unknown names and keys, with close-match suggestions -------------------------------------
@pytest.mark.slow
def test_unknown_component_name_suggests_close_match() -> None:
    err = fails(
        ["objective.trust_region=sequence_bernouli_kl"],
        "objective.trust_region",
        "'sequence_bernoulli_kl'",
    )
    assert err.suggestions[0] == "sequence_bernoulli_kl"
    fails(["objective.baseline=batchmean"], "objective.baseline", "'batch_mean'")
    fails(["objective.aggregation=sample_men"], "objective.aggregation", "'sample_mean'")
    fails(
        ["objective.token_filter=entropy_failure"], "objective.token_filter", "'entropy_failures'"
    )


@pytest.mark.slow
def test_unknown_key_in_a_section_suggests_close_match() -> None:
    err = fails(["+rollout.max_inflight=3"], "rollout.max_inflight", "'max_in_flight'")
    assert "max_in_flight" in err.suggestions
    fails(["+data.micro_batchsize=4"], "data.micro_batchsize", "'micro_batch_size'")
    fails(["+rollout.sampling.topp=0.9"], "rollout.sampling.topp", "'top_p'")
    fails(["+optim.learning_rate=1"], "optim.learning_rate")


def test_unknown_top_level_key() -> None:
    fails(["+sead=1"], "sead", "'seed'")


def test_unknown_objective_key_and_component_kwarg() -> None:
    fails(["+objective.trust_reigon=none"], "objective.trust_reigon", "'trust_region'")
    fails(
        ["+objective.sequence_bernoulli_kl.dleta=1"],
        "objective.sequence_bernoulli_kl.dleta",
        "'delta'",
    )
    fails(["+objective.token_tis.delta=1"], "objective.token_tis.delta", "cap")


def test_unknown_trainer_argument_and_frlab_owned_ones() -> None:
    fails(["+trainer.max_step=3"], "trainer.max_step", "'max_steps'")
    fails(
        ["+trainer.accumulate_grad_batches=2"],
        "trainer.accumulate_grad_batches",
        "data.micro_batch_size",
    )
    fails(["+trainer.gradient_clip_val=1.0"], "trainer.gradient_clip_val", "optim.grad_clip")


@pytest.mark.slow
def test_unknown_choice_values() -> None:
    fails(["rollout.engine=torhc"], "rollout.engine", "'torch'")
    fails(["rollout.mode=asynch"], "rollout.mode", "'async'")
    fails(["optim.scheduler=cosin"], "optim.scheduler", "'cosine'")
    fails(["trainer.precision=bf16"], "trainer.precision", "bf16-mixed")
    fails(["model.dtype=bf16"], "model.dtype", "bfloat16")


# -- wrong types and ranges ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("override", "key", "fragment"),
    [
        ("data.batch_size=abc", "data.batch_size", "could not be converted to Integer"),
        ("data.batch_size=16.5", "data.batch_size", "Integer"),
        ("rollout.sampling.top_k=true", "rollout.sampling.top_k", "Integer"),
        ("dry_run=maybe", "dry_run", "not a valid bool"),
        ("optim.lr=fast", "optim.lr", "Float"),
        (
            "objective.sequence_bernoulli_kl.delta=-1e-3",
            "objective.sequence_bernoulli_kl.delta",
            "[0",
        ),
        (
            "objective.sequence_bernoulli_kl.delta=nan",
            "objective.sequence_bernoulli_kl.delta",
            "NaN",
        ),
        ("objective.entropy_failures.q=1.5", "objective.entropy_failures.q", "[0, 1]"),
        ("optim.lr=0", "optim.lr", "(0"),
        ("trainer.max_steps=0", "trainer.max_steps", "[1"),
        ("rollout.sampling.temperature=0", "rollout.sampling.temperature", "(0"),
        ("rollout.sampling.top_p=0", "rollout.sampling.top_p", "(0"),
        ("optim.warmup_ratio=1.0", "optim.warmup_ratio", "1)"),
        ("optim.betas=[0.9]", "optim.betas", "two numbers"),
        ("seed=-1", "seed", "[0"),
        ("data.batch_size=null", "data.batch_size", "not Optional"),
        ("model.gradient_checkpointing=3", "model.gradient_checkpointing", "true, false or auto"),
        ("model.gradient_checkpointing=sometimes", "model.gradient_checkpointing", "or auto"),
        (
            "data.max_tokens_per_micro_batch=big",
            "data.max_tokens_per_micro_batch",
            "an int, null or auto",
        ),
        ("data.max_tokens_per_micro_batch=1.5", "data.max_tokens_per_micro_batch", "an int"),
        ("data.max_tokens_per_micro_batch=0", "data.max_tokens_per_micro_batch", "[1"),
        ("model.compile=3", "model.compile", "true or false"),
    ],
)
def test_wrong_types_and_ranges(override: str, key: str, fragment: str) -> None:
    fails([override], key, fragment)


def test_auto_is_taken_by_the_budget_and_checkpointing() -> None:
    plan = preflight(
        compose(["data.max_tokens_per_micro_batch=auto", "model.gradient_checkpointing=auto"])
    )
    assert (plan["data.max_tokens_per_micro_batch"], plan["model.gradient_checkpointing"]) == (
        "auto",
        "auto",
    )


def test_q_needs_the_filter_to_matter_but_is_validated_anyway() -> None:
    fails(["objective.entropy_failures.q=-0.1"], "objective.entropy_failures.q")


def test_delta_inf_is_no_trust_region_and_passes() -> None:
    plan = preflight(compose(["objective.sequence_bernoulli_kl.delta=inf"]))
    assert plan["objective.sequence_bernoulli_kl.delta"] == float("inf")


# -- cross-field rules -------------------------------------------------------------------------
@pytest.mark.slow
def test_batch_must_split_over_ranks_and_micro_batches() -> None:
    fails(["data.batch_size=32", "data.micro_batch_size=12"], "data.micro_batch_size", "32")
    fails(["trainer.devices=3"], "data.batch_size", "= 3")
    fails(
        ["trainer.devices=2", "data.batch_size=32", "data.micro_batch_size=32"],
        "data.micro_batch_size",
        "= 16",
    )
    plan = preflight(compose(["trainer=ddp_cpu", "data.batch_size=32", "data.micro_batch_size=8"]))
    assert (plan["ranks"], plan["per_rank_batch_size"], plan["micro_batches_per_step"]) == (
        2,
        16,
        2,
    )


@pytest.mark.slow
def test_off_policy_correction_needs_full_support() -> None:
    fails(["rollout.sampling.top_p=0.9"], "rollout.sampling.top_p", "importance sampling")
    fails(["rollout.sampling.top_k=20"], "rollout.sampling.top_k", "off-policy correction")
    fails(["objective=pg_is", "rollout.sampling.top_k=20"], "rollout.sampling.top_k")
    # Without correction (no_is) truncated sampling is allowed.
    plan = preflight(compose(["objective.trust_region=no_is", "rollout.sampling.top_p=0.9"]))
    assert not any(k.endswith(".delta") for k in plan)


@pytest.mark.slow
def test_group_baselines_need_several_samples_in_either_mode() -> None:
    for preset in ("grpo", "dr_grpo", "rloo"):
        fails([f"objective={preset}"], "rollout.samples_per_prompt", "batch_mean")
    plan = preflight(compose(["objective=grpo", "rollout.samples_per_prompt=4"]))
    assert (plan["rollout.mode"], plan["rollout.samples_per_prompt"]) == (
        "async",
        4,
    )  # groups in the async pool
    fails(
        ["rollout=sync", "objective=rloo", "rollout.samples_per_prompt=5"], "data.batch_size", "5"
    )
    plan = preflight(compose(["rollout=sync", "objective=grpo", "rollout.samples_per_prompt=4"]))
    assert (
        plan["objective.baseline"] == "group_mean_std" and plan["rollout.samples_per_prompt"] == 4
    )


def test_each_ranks_share_of_the_batch_holds_whole_groups() -> None:
    grpo = ["trainer=ddp_cpu", "objective=grpo", "rollout.mode=sync"]
    err = fails(
        [*grpo, "rollout.samples_per_prompt=64", "data.batch_size=64", "data.micro_batch_size=32"],
        "rollout.samples_per_prompt",
        "per-rank batch",
        "64 / 2 = 32",
        "each rank's pool",
    )
    assert "data.batch_size a multiple of 128" in str(err)
    plan = preflight(
        compose(
            [*grpo, "rollout.samples_per_prompt=8", "data.batch_size=32", "data.micro_batch_size=8"]
        )
    )
    assert (plan["ranks"], plan["per_rank_batch_size"], plan["rollout.samples_per_prompt"]) == (
        2,
        16,
        8,
    )


def test_a_group_must_fit_in_flight() -> None:
    fails(
        [
            "objective=grpo",
            "rollout=sync",
            "rollout.samples_per_prompt=8",
            "rollout.max_in_flight=4",
        ],
        "rollout.max_in_flight",
        "samples_per_prompt (8)",
    )


def test_batch_mean_with_one_sample_per_prompt_is_the_papers_case() -> None:
    plan = preflight(compose(["objective=flashreinforce", "rollout.samples_per_prompt=1"]))
    assert plan["objective.baseline"] == "batch_mean" and plan["rollout.samples_per_prompt"] == 1


def test_async_weight_sync_must_respect_the_lag_bound() -> None:
    fails(["rollout.sync_every=3"], "rollout.sync_every", "max_policy_lag")
    fails(["rollout.max_policy_lag=0"], "rollout.sync_every")
    plan = preflight(compose(["rollout.sync_every=2", "rollout.max_policy_lag=2"]))
    assert (plan["rollout.sync_every"], plan["rollout.max_policy_lag"]) == (2, 2)


def test_lengths_and_engine_rules() -> None:
    fails(["rollout.max_len=4"], "rollout.max_len", "max_new_tokens")
    fails(["rollout.max_len=512"], "rollout.max_len", "max_position_embeddings")


def test_vllm_beside_a_cpu_learner_asks_the_installed_vllm() -> None:
    """Without vLLM the CPU trainer's `rollout/engine=vllm` names the CPU build's installer;
    the tier tests/vllm_cpu checks that vLLM's CPU build is accepted."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here (tests/vllm_cpu covers its CPU build)")
    fails(["rollout/engine=vllm"], "trainer.accelerator", "vLLM's CPU build", "vllm_cpu_env.sh")


def test_the_process_engine_is_cpu_only_and_records_routing() -> None:
    fails(["rollout/engine=torch_process", "rollout.device=cuda"], "rollout.device", "CPU only")
    fails(
        ["rollout/engine=torch_process", "rollout.engine.device=cuda:0"],
        "rollout.engine.device",
        "CPU only",
    )
    fails(
        ["rollout/engine=torch_process", "rollout.engine.num_threads=0"],
        "rollout.engine.num_threads",
    )
    plan = preflight(compose(["rollout/engine=torch_process"]))
    assert plan["rollout.engine"] == "torch_process"


def test_preflight_asks_the_engine_class_for_its_devices_and_routing(monkeypatch) -> None:
    """Devices and routing replay are the engine class's own declarations, not names: an
    engine that declared CUDA would be accepted there, one that stops recording routing is
    refused, and the refusal lists the options whose classes do record it."""
    from frlab.rollout.torch.engine import TorchEngine
    from frlab.rollout.torch.process import ProcessTorchEngine

    monkeypatch.setattr(ProcessTorchEngine, "devices", ("cpu", "cuda"))
    assert preflight(compose(["rollout/engine=torch_process", "rollout.device=cuda"]))
    monkeypatch.setattr(TorchEngine, "devices", ("cuda",))
    fails(["rollout.device=cpu"], "rollout.device", "TorchEngine", "CUDA only")
    monkeypatch.setattr(ProcessTorchEngine, "records_routing", False)
    err = fails(
        ["model.routing_replay=true", "rollout/engine=torch_process"],
        "model.routing_replay",
        "rollout/engine=torch)",
    )
    assert "torch_process" not in str(err).split("(", 1)[1].split(")")[0]


def test_resubmit_with_routing_replay_is_the_engines_own_rule_at_preflight() -> None:
    """Preflight refuses what the engine constructor would, with the engine's own words: a
    re-prefilled position would have two routings."""

    overrides = ["model.routing_replay=true", "rollout.weight_update=resubmit"]
    err = fails(overrides, "rollout.weight_update", "two routings", "model.routing_replay")
    with pytest.raises(ValueError) as built:
        torch_engine(None, weight_update="resubmit", record_routing=True)  # refused before use
    assert str(built.value).removeprefix("rollout.weight_update ") in str(err)


def test_missing_values() -> None:
    fails(["model=hf"], "model.name_or_path", "???")
    fails(["model.config=null"], "model.name_or_path", "model.config")
    fails(["~model.config.model_type"], "model.config.model_type")
    fails(["~data.micro_batch_size"], "data.micro_batch_size", "does not support deletion")


def test_a_node_without_a_target_is_refused() -> None:
    """Any importable `_target_` is built (a config is code the user runs); a node that must
    name one and does not is refused at its key."""
    fails(["~env._target_"], "env._target_", "missing")
    fails(["+callbacks.mine={every: 1}"], "callbacks.mine._target_", "missing")


@pytest.mark.slow
def test_preflight_does_not_import_an_environments_libraries() -> None:
    """Preflight reads the env class's signature (envs.alfworld is light) but never imports
    ALFWorld itself; in a fresh interpreter, as other tests in this process may have."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from frlab.config.compose import compose\n"
        "from frlab.config.preflight import preflight\n"
        "preflight(compose(['experiment=alfworld_qwen7b']))\n"
        "print(sorted(m for m in sys.modules if m.startswith(('alfworld', 'textworld'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.slow
def test_a_dry_run_checks_the_env_nodes_keys_against_its_class() -> None:
    """Unknown and missing constructor arguments are found without building the env; a key
    the class takes passes."""
    err = fails(["+env.num_digit=3"], "env.num_digit", "unknown argument", "envs.toy.ParityEnv")
    assert err.suggestions == ["num_digits"]
    fails(["env=math", "+env.templte=base"], "env.templte", "did you mean 'template'")
    preflight(compose(["env=math", "env.template=base"]))
    holdout = "env._target_=envs.math.holdout.check_holdout"  # a callable with a required arg
    fails([holdout], "env.num_digits", "unknown argument")
    fails([holdout, "~env.num_digits"], "env.holdout", "missing: a required argument")


def test_a_target_from_the_users_own_package_needs_no_flag(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A class not importable here (a package installed only where the run goes) is left to
    the run, quietly: the plan names it."""
    with caplog.at_level("WARNING"):
        plan = preflight(compose(["env._target_=mypkg.envs.MyEnv"]))
    assert plan["env._target_"] == "mypkg.envs.MyEnv"
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


@pytest.mark.slow
def test_lora_needs_an_engine_that_serves_it_and_valid_settings() -> None:
    """Engine classes that declare serves_lora take LoRA policies; a fleet only with the modes
    it implements for adapters; a class that does not declare it is refused by name."""
    import dataclasses

    from frlab.config.schema import LoraConfig
    from frlab.rollout.engine import Engine

    preflight(compose(["model.lora.rank=8"]))  # torch: accepted
    preflight(compose(["model.lora.rank=8", "rollout/engine=torch_process"]))
    fleet = ["model.lora.rank=8", "rollout=remote", "rollout.remote.servers=[http://127.0.0.1:1]"]
    preflight(compose(fleet))
    preflight(compose([*fleet, "rollout.weight_update=resubmit"]))
    fails(
        [*fleet, "rollout.weight_update=in_flight"],
        "rollout.weight_update",
        "'in_flight' is not exact on the remote (with model.lora) engine",
        "drain, resubmit",
    )
    lora = dataclasses.asdict(LoraConfig(rank=8))
    config = {
        "rollout": {"engine": {"_target_": "mine.Engine"}},
        "model": {"lora": lora},
        "trainer": {"accelerator": "cpu"},
    }
    with pytest.raises(
        ValueError, match="model.lora.rank`: the mine.Engine engine .*does not declare"
    ):
        Engine.check_config(config, 1, {})
    fails(["model.lora.rank=8", "model.lora.dropout=1.0"], "model.lora.dropout")


def test_an_engines_learner_refusal_keeps_its_key_and_a_plain_one_names_the_engine() -> None:
    """`check_learner` raising ConfigError reaches the user with the engine's key (vLLM without
    its CPU build beside a CPU learner: `trainer.accelerator`); a plain ValueError (an
    out-of-tree engine's) is keyed `rollout.engine`, naming the option."""
    from frlab.errors import ConfigError
    from frlab.rollout.engine import Engine

    class Keyed(Engine):
        @classmethod
        def check_learner(cls, accelerator: str) -> None:
            raise ConfigError("trainer.accelerator", f"{accelerator!r} needs a GPU")

    class Plain(Engine):
        @classmethod
        def check_learner(cls, accelerator: str) -> None:
            raise ValueError("no learner on this machine")

    config = {
        "rollout": {"engine": {"_target_": "mine.Engine"}},
        "model": {},
        "trainer": {"accelerator": "cpu"},
    }
    with pytest.raises(ConfigError) as keyed:
        Keyed.check_config(config, 1, {"mine": "mine.Engine"})
    assert (keyed.value.key, keyed.value.reason) == ("trainer.accelerator", "'cpu' needs a GPU")
    with pytest.raises(ConfigError) as plain:
        Plain.check_config(config, 1, {"mine": "mine.Engine"})
    assert plain.value.key == "rollout.engine"
    assert plain.value.reason == "'mine': no learner on this machine"


def test_compile_with_routing_replay_is_refused_naming_both_keys() -> None:
    fails(
        ["model.compile=true", "model.routing_replay=true"],
        "model.compile",
        "model.routing_replay=true",
    )
