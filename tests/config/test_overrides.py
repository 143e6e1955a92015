"""Command-line typos are caught before Hydra runs, with close-match suggestions."""

from __future__ import annotations

import pytest

from frlab.config.compose import compose
from frlab.config.errors import ConfigError
from frlab.config.overrides import check_key_exists, check_overrides, group_options


def test_group_options_list_the_yaml_files() -> None:
    assert {"flashreinforce", "pg_is", "grpo", "dr_grpo", "rloo"} <= set(group_options("objective"))
    assert {"csv", "tensorboard", "wandb"} <= set(group_options("logger"))
    assert "toy_cpu" in group_options("experiment")
    assert group_options("not_a_group") == []


@pytest.mark.parametrize(
    ("args", "key", "suggestion"),
    [
        (["objective=flashreinforse"], "objective", "flashreinforce"),
        (["experiment=toy_cpus"], "experiment", "toy_cpu"),
        (["-m", "objective=grpo,rlo"], "objective", "rloo"),
        (["logger=tensorbord"], "logger", "tensorboard"),
        (["sweep=r1_ablation"], "sweep", "r1_ablations"),
        (["rollout.max_inflight=3"], "rollout.max_inflight", "max_in_flight"),
        (["trainer.max_step=3"], "trainer.max_step", "max_steps"),
        (["objective.sequence_bernouli_kl.delta=1"], "objective.sequence_bernouli_kl",
         "sequence_bernoulli_kl"),
    ],
)  # fmt: skip
def test_typos_raise_with_suggestions(args: list[str], key: str, suggestion: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_overrides(args)
    assert info.value.key == key
    assert suggestion in info.value.suggestions, str(info.value)


def test_valid_overrides_pass() -> None:
    check_overrides(["-m", "objective.trust_region=a,b", "seed=0,1", "dry_run=true"])
    check_overrides(["experiment=r1_distill_1p5b", "model.name_or_path=/x", "+trainer.max_time=1"])
    check_overrides(["logger=null", "~callbacks.model_checkpoint", "hydra/launcher=basic"])
    check_overrides(["objective=grpo", "objective.ppo_clip.eps_high=0.3"])


def test_key_check_uses_the_chosen_groups() -> None:
    # `name_or_path` exists only after model=hf... and in toy_qwen2 as null: both fine;
    # a key of a group option that is not chosen is rejected.
    check_overrides(["model=hf", "model.name_or_path=/x"])
    cfg = compose([], with_hydra=False)
    with pytest.raises(ConfigError, match="is a value, not a mapping"):
        check_key_exists(cfg, "seed.x")
