"""Every registered component is selectable from the CLI, documented from its declaration, and
has its diagnostics logged; the committed config and docs equal what the declarations generate."""

from __future__ import annotations

import math
import re

import pytest
import torch
from helpers.objective import make_batch
from omegaconf import OmegaConf

from frlab.config.compose import compose
from frlab.config.plan import component_params
from frlab.config.preflight import preflight
from frlab.generated import stale_files
from frlab.learner.metrics import ACCEPTANCE, StepMetrics
from frlab.objective import KINDS, Objective
from frlab.objective.catalog import (
    KEYS_FILE,
    PARAMS_FILE,
    README_FILE,
    ROOT,
    components,
    kind_title,
    yaml_number,
)

CASES = [(kind, cls.name) for kind, cls in components()]


def test_committed_config_and_docs_equal_what_the_declarations_generate() -> None:
    assert stale_files() == [], "run `python -m frlab.generated --write`"


@pytest.mark.parametrize("value", [3e-3, 1e-6, 0.999, 1.001, 2.0, 0.2, 4096, math.inf, 0.0])
def test_yaml_numbers_read_back_as_the_same_value(value: float) -> None:
    text = yaml_number(value)
    assert OmegaConf.create(f"x: {text}").x == value and type(
        OmegaConf.create(f"x: {text}").x
    ) is type(value)


def _overrides(kind: str, name: str) -> list[str]:
    cls = KINDS[kind].get(name)
    extra = (
        ["rollout=sync", "rollout.samples_per_prompt=2"] if getattr(cls, "is_group", False) else []
    )
    return [f"objective.{kind}={name}", *extra]


@pytest.mark.parametrize(("kind", "name"), CASES)
def test_every_component_is_selectable_documented_and_logged(kind: str, name: str) -> None:
    cls = KINDS[kind].get(name)
    # selectable: `objective.<kind>=<name>` composes and passes preflight, defaults included
    plan = preflight(compose(_overrides(kind, name)))
    assert plan[f"objective.{kind}"] == name
    if cls.hyperparameters():
        assert component_params(plan, name) == cls.defaults()
    # documented: its README row, the key reference's slot comment, its defaults in the config
    readme = (ROOT / README_FILE).read_text()
    assert f"| {kind_title(kind)} | `{name}` | {cls.summary().rstrip('.')} |" in readme
    schema = (ROOT / KEYS_FILE).read_text()
    section = schema[schema.index("# objective:begin") : schema.index("# objective:end")]
    assert name in re.findall(r"\w+", section)
    params = OmegaConf.load(ROOT / PARAMS_FILE)
    assert dict(params.get(name) or {}) == cls.defaults()
    if kind != "trust_region":
        return
    # logged: each declared diagnostic reaches the step's metrics under its own name
    objective = Objective(trust_region=name)
    x = make_batch(6, 9, seed=7, drift=0.2)
    adv = objective.advantages(x["rewards"])
    _, diag = objective(x["log_probs"], x["behavior_log_probs"], adv, x["action_mask"])
    step = StepMetrics(objective)
    step.update_diagnostics(diag)
    values = step.compute()
    for d in cls.diagnostics:
        assert values[d.metric(name)] == pytest.approx(
            float(diag[d.name].double().mean()), rel=1e-12
        )
    assert (ACCEPTANCE in values) == (not cls.admits_all)
    if cls.admits_all:
        assert bool(diag["admitted"].all())  # by construction, hence not logged


def test_a_diagnostic_the_component_does_not_declare_is_refused() -> None:
    """The objective checks the return contract: an undeclared statistic would never be logged."""
    from dataclasses import dataclass

    from frlab.objective import TrustRegion

    @dataclass(frozen=True)
    class Chatty(TrustRegion):
        """Admit all, report an undeclared statistic."""

        def __call__(self, batch):  # noqa: ANN001, ANN204
            return self.admit_rows(batch, batch.all_rows(), surprise=batch.sequence_kl)

    objective = Objective()
    objective.trust_region = Chatty()
    x = make_batch(3, 4, seed=1)
    with pytest.raises(ValueError, match=r"returned diagnostics \['surprise'\] but declares \[\]"):
        objective(
            x["log_probs"],
            x["behavior_log_probs"],
            objective.advantages(x["rewards"]),
            x["action_mask"],
        )
    assert torch.isfinite(x["rewards"]).all()


def test_the_objective_group_holds_exactly_the_presets() -> None:
    """Presets live in frlab.objective.PRESETS; the `objective` config group is generated from
    it, one file per preset and no other (a hand-made preset file would be a second place)."""
    from frlab.config.compose import group_options
    from frlab.objective import PRESETS
    from frlab.objective.catalog import PRESETS_DIR, preset_yaml

    assert group_options("objective") == sorted(PRESETS)
    for name in PRESETS:
        assert (ROOT / PRESETS_DIR / f"{name}.yaml").read_text() == preset_yaml(name)
