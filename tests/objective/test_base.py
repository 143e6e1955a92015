"""The component contract: hyperparameter declarations, TokenBatch's shared statistics, and the
trust-region return contract the objective enforces."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from frlab.objective import (
    TRUST_REGIONS,
    Diagnostic,
    Hyperparameter,
    HyperparameterError,
    Objective,
    TokenBatch,
    TrustRegion,
    TrustRegionOutput,
)
from frlab.objective.trust_regions import GeometricRatio, SequenceBernoulliKL, TruncatedIS

L = math.log


# --------------------------------------------------------------------------- hyperparameters


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        (Hyperparameter("d", "float", 0.0, "", low=0.0), "[0, inf]"),
        (Hyperparameter("c", "float", 1.0, "", low=0.0, low_open=True, finite=True), "(0, inf)"),
        (Hyperparameter("q", "float", 1.0, "", low=0.0, high=1.0), "[0, 1]"),
        (Hyperparameter("n", "int", 1, "", low=1), "[1, inf)"),
        (
            Hyperparameter("x", "float", 0.5, "", low=0.25, high=0.75, high_open=True),
            "[0.25, 0.75)",
        ),
    ],
)
def test_range_text(spec: Hyperparameter, text: str) -> None:
    assert spec.range_text() == text


def test_check_converts_and_refuses_naming_the_key() -> None:
    delta = SequenceBernoulliKL.spec("delta")
    assert delta.check(1) == 1.0 and isinstance(delta.check(1), float)
    assert delta.check(torch.tensor(2e-3, dtype=torch.float64)) == 2e-3  # 0-d tensor
    assert delta.check(math.inf) == math.inf
    for bad, reason in [
        (True, "real number"),
        ("3e-3", "real number"),
        (math.nan, "NaN"),
        (-1e-3, r"in \[0, inf\], got -0.001"),
        (torch.tensor([1e-3]), "real"),
    ]:
        with pytest.raises(HyperparameterError, match=f"objective.x.delta must .*{reason}") as err:
            delta.check(bad, "objective.x.delta")
        assert err.value.key == "objective.x.delta"
    with pytest.raises(HyperparameterError, match=r"finite, in \(0, inf\)"):
        TruncatedIS.spec("cap").check(math.inf)
    length = Hyperparameter("length", "int", 1, "", low=1)
    assert length.check(7) == 7
    for bad in (1.5, True, "8", 0):
        with pytest.raises(HyperparameterError, match="length"):
            length.check(bad)


def test_declarations_drive_construction_defaults_and_cross_field_rules() -> None:
    assert GeometricRatio.defaults() == {"lower": 0.999, "upper": 1.001}
    assert GeometricRatio(lower=0.5).params() == {"lower": 0.5, "upper": 1.001}
    with pytest.raises(ValueError, match="geometric_ratio.lower must be in"):
        GeometricRatio(lower=-1.0)
    with pytest.raises(ValueError, match="lower <= upper"):
        GeometricRatio(lower=1.2, upper=1.1)
    with pytest.raises(KeyError, match="no hyperparameter 'cap'"):
        GeometricRatio.spec("cap")
    with pytest.raises(ValueError, match="identifier"):
        Diagnostic("not a name", "")


# --------------------------------------------------------------------------- TokenBatch


def test_ratio_is_formed_on_kept_tokens_only() -> None:
    """Token 0 has log rho = 1000 (exp overflows even float64) but is not kept: its ratio is 1,
    never exp(1000); the gate statistics still see every policy token."""
    cur = torch.tensor([[0.0, L(0.4)]], dtype=torch.float64)
    beh = torch.tensor([[-1000.0, L(0.5)]], dtype=torch.float64)
    mask = torch.tensor([[True, True]])
    keep = torch.tensor([[False, True]])
    batch = TokenBatch(cur, beh, torch.ones(1, dtype=torch.float64), mask, keep)
    assert batch.ratio.tolist() == [[1.0, pytest.approx(0.8)]]
    assert batch.log_ratio[0, 0].item() == 1000.0
    assert batch.sequence_kl.item() > 0 and math.isfinite(batch.sequence_kl.item())
    out = TRUST_REGIONS.build("none")(batch)
    assert out.weights.tolist() == [[0.0, pytest.approx(0.8)]]


def test_shared_statistics_are_computed_once() -> None:
    x = torch.tensor([[L(0.4), L(0.5)]], dtype=torch.float64)
    batch = TokenBatch(
        x, x - 0.1, torch.ones(1, dtype=torch.float64), torch.ones(1, 2, dtype=torch.bool)
    )
    assert batch.sequence_kl is batch.sequence_kl and batch.token_kl is batch.token_kl
    assert batch.ratio is batch.ratio and batch.log_ratio is batch.log_ratio
    flags = torch.tensor([[True, False]])
    assert (
        batch.token_fraction(flags).item() == 0.5
        and batch.token_fraction(flags).dtype == torch.float64
    )


# --------------------------------------------------------------------------- return contract


def _objective_with(component: TrustRegion) -> Objective:
    objective = Objective()
    objective.trust_region = component
    return objective


@dataclass(frozen=True)
class _WrongShape(TrustRegion):
    """Declares a per-row statistic, returns a scalar."""

    diagnostics = (Diagnostic("spread", "per row"),)

    def __call__(self, batch: TokenBatch) -> TrustRegionOutput:
        return self.admit_rows(batch, batch.all_rows(), spread=batch.sequence_kl.mean())


@dataclass(frozen=True)
class _FloatAdmitted(TrustRegion):
    """Returns a float admission mask."""

    def __call__(self, batch: TokenBatch) -> TrustRegionOutput:
        out = self.admit_rows(batch, batch.all_rows())
        return TrustRegionOutput(out.weights, out.admitted.float())


@pytest.mark.parametrize(
    ("component", "pattern"),
    [
        (_WrongShape(), r"'spread' \(per=row\) must have shape \[3\], got \[\]"),
        (_FloatAdmitted(), r"`admitted` as a bool \[B\]"),
    ],
)
def test_the_objective_enforces_the_return_contract(component: TrustRegion, pattern: str) -> None:
    lp = torch.log(torch.full((3, 2), 0.5, dtype=torch.float64))
    objective = _objective_with(component)
    with pytest.raises(ValueError, match=pattern):
        objective(lp, lp, torch.zeros(3, dtype=torch.float64), torch.ones(3, 2, dtype=torch.bool))
