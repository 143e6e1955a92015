"""The dry-run plan names the chosen trust region with its own parameters."""

from __future__ import annotations

import pytest

from frlab.config.compose import compose
from frlab.config.preflight import preflight


def trust_row(overrides: list[str]) -> str:
    """The `trust` line of the printed plan, after the colon."""
    plan = preflight(compose(overrides))
    rows = [line for line in plan.format().splitlines() if line.strip().startswith("trust ")]
    assert len(rows) == 1, plan.format()
    return rows[0].split(":", 1)[1].strip()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["objective.trust_region=token_tis"], "token_tis cap=2.0;"),
        (["objective.trust_region=token_tis", "objective.token_tis.cap=5"], "token_tis cap=5.0;"),
        (["objective.trust_region=ppo_clip", "objective.ppo_clip.eps_high=0.28"],
         "ppo_clip eps_low=0.2 eps_high=0.28;"),
        (["objective.trust_region=geometric_ratio", "objective.geometric_ratio.lower=0.99"],
         "geometric_ratio lower=0.99 upper=1.001;"),
        (["objective.sequence_bernoulli_kl.delta=0.01"], "sequence_bernoulli_kl delta=0.01;"),
        (["objective.trust_region=none"], "plain token IS, no gate;"),
        (["objective.trust_region=no_is"], "no IS, no gate;"),
    ],
)  # fmt: skip
def test_trust_row_shows_the_chosen_trust_regions_parameters(
    overrides: list[str], expected: str
) -> None:
    row = trust_row(overrides)
    assert row.startswith(expected), row
    assert "off" not in row


def test_plan_records_the_trust_description() -> None:
    plan = preflight(compose(["objective.trust_region=token_tis"]))
    assert plan.to_dict()["trust"] == "token_tis cap=2.0"
    assert plan.delta is None
