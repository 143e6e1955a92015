"""Aggregations: exact hand-computed values, global normalisers, NaN-safe selection."""

from __future__ import annotations

import pytest
import torch

from frlab.objective import AGGREGATIONS, Objective

TERMS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
KEEP = torch.tensor([[True, True, False], [True, False, False]])
MASK = torch.tensor([[True, True, True], [True, True, False]])  # T = (3, 2), 5 policy tokens


def agg(name: str, **kw: int):
    return AGGREGATIONS.build(name, **kw)


def test_sample_mean_hand_values() -> None:
    """Row sums over kept tokens (3, 4) over ORIGINAL T_i (3, 2) = (1, 2); / B = 2 -> 1.5;
    with a global B of 4 the same rows give 0.75."""
    f = agg("sample_mean")
    assert f(TERMS, KEEP, MASK, num_sequences=2, num_tokens=5).item() == 1.5
    assert f(TERMS, KEEP, MASK, num_sequences=4, num_tokens=5).item() == 0.75


def test_token_mean_hand_values() -> None:
    """(1 + 2 + 4) / num_tokens: 7 / 5 = 1.4, or 7 / 10 with a global count of 10."""
    f = agg("token_mean")
    assert f(TERMS, KEEP, MASK, num_sequences=2, num_tokens=5).item() == pytest.approx(1.4)
    assert f(TERMS, KEEP, MASK, num_sequences=2, num_tokens=10).item() == pytest.approx(0.7)


def test_constant_length_hand_values() -> None:
    """(3 / 10 + 4 / 10) / 2 = 0.35 with L = 10, whatever T_i is."""
    got = agg("constant_length", length=10)(TERMS, KEEP, MASK, num_sequences=2, num_tokens=5)
    assert got.item() == pytest.approx(0.35, rel=1e-15)


@pytest.mark.parametrize("name", ["sample_mean", "token_mean", "constant_length"])
def test_dropped_nan_inf_never_reach_loss_or_grad(name: str) -> None:
    kw = {"length": 7} if name == "constant_length" else {}
    terms = TERMS.clone()
    terms[0, 2], terms[1, 1], terms[1, 2] = float("nan"), float("inf"), -float("inf")
    terms.requires_grad_(True)
    loss = agg(name, **kw)(terms, KEEP, MASK, num_sequences=2, num_tokens=5)
    loss.backward()
    clean = agg(name, **kw)(TERMS, KEEP, MASK, num_sequences=2, num_tokens=5)
    assert loss.item() == clean.item()
    assert torch.isfinite(terms.grad).all() and (terms.grad[~KEEP] == 0).all()


def test_sample_mean_gradient_is_one_over_t_b() -> None:
    terms = TERMS.clone().requires_grad_(True)
    agg("sample_mean")(terms, KEEP, MASK, num_sequences=2, num_tokens=5).backward()
    expected = torch.tensor([[1 / 6, 1 / 6, 0.0], [1 / 4, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(terms.grad, expected)


def test_tensor_normalisers_are_accepted() -> None:
    """A device tensor (e.g. an all-reduced global count) works like the int."""
    f = agg("token_mean")
    got = f(TERMS, KEEP, MASK, num_sequences=torch.tensor(2), num_tokens=torch.tensor(5))
    assert got.item() == pytest.approx(1.4)


@pytest.mark.parametrize("name", ["sample_mean", "token_mean", "constant_length"])
@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "4"])
def test_normaliser_validation(name: str, bad: object) -> None:
    kw = {"length": 7} if name == "constant_length" else {}
    field = "num_tokens" if name == "token_mean" else "num_sequences"
    norms = {"num_sequences": 2, "num_tokens": 5, field: bad}
    with pytest.raises(ValueError, match=field):
        agg(name, **kw)(TERMS, KEEP, MASK, **norms)


@pytest.mark.parametrize("length", [0, -1, 3.5, None])
def test_constant_length_validation(length: object) -> None:
    with pytest.raises(ValueError, match="constant_length.length"):
        agg("constant_length", length=length)


def test_constant_length_unknown_hyperparameter_is_named() -> None:
    with pytest.raises(ValueError, match="unknown hyperparameter 'lenght'.*did you mean 'length'"):
        Objective(aggregation="constant_length", params={"constant_length": {"lenght": 8}})
