"""Objective selection by plain-string names: presets, one slot per kind, no leaking kwargs."""

from __future__ import annotations

import pytest

from frlab.config.compose import compose
from frlab.config.plan import component_params, components
from frlab.config.preflight import check_objective, preflight
from frlab.objective import PRESETS


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_objective_presets_compose_to_the_registered_preset(preset: str) -> None:
    cfg = compose([f"objective={preset}"])
    node = cfg.objective
    for slot, name in PRESETS[preset].items():
        assert node[slot] == name, (preset, slot)


def test_slots_are_plain_strings_switched_one_at_a_time() -> None:
    cfg = compose(["objective.baseline=batch_mean_std", "objective.aggregation=token_mean"])
    plan = preflight(cfg)
    assert components(plan) == {
        "baseline": "batch_mean_std",
        "trust_region": "sequence_bernoulli_kl",
        "aggregation": "token_mean",
        "token_filter": "none",
    }


def test_switching_trust_region_does_not_leak_the_previous_components_kwargs() -> None:
    # alfworld tightens the Bernoulli-KL gate to delta 1e-3; a token-level gate chosen on top
    # must get ITS OWN delta (3e-3 default), not the sequence gate's.
    base = ["experiment=alfworld_qwen7b"]
    assert preflight(compose(base))["objective.sequence_bernoulli_kl.delta"] == pytest.approx(1e-3)
    cfg = compose([*base, "objective.trust_region=token_bernoulli_kl"])
    plan = preflight(cfg)
    assert plan["objective.token_bernoulli_kl.delta"] == pytest.approx(3e-3)
    assert {k.split(".")[1] for k in plan if k.count(".") == 2 and k.startswith("objective.")} == {
        "token_bernoulli_kl",
        "entropy_failures",
    }
    objective = check_objective(dict(cfg.objective))
    assert objective.trust_region.delta == pytest.approx(3e-3)


def test_switching_to_a_component_without_kwargs_carries_none() -> None:
    cfg = compose(["objective.sequence_bernoulli_kl.delta=0.5", "objective.trust_region=token_tis"])
    plan = preflight(cfg)
    assert component_params(plan, "token_tis") == {"cap": 2.0}
    assert not hasattr(check_objective(dict(cfg.objective)).trust_region, "delta")


def test_preset_switch_keeps_each_components_own_settings() -> None:
    cfg = compose(
        [
            "objective.ppo_clip.eps_high=0.28",
            "objective=grpo",
            "rollout=sync",
            "rollout.samples_per_prompt=4",
        ]
    )
    plan = preflight(cfg)
    assert component_params(plan, "ppo_clip") == {"eps_low": 0.2, "eps_high": 0.28}
    assert component_params(plan, "sequence_bernoulli_kl") == {}
