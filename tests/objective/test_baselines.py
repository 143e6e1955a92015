"""Baselines: exact hand-computed advantages, group errors, exact zeros, dtypes, no gradient."""

from __future__ import annotations

import math

import pytest
import torch

from frlab.objective import BASELINES

R = torch.tensor([1.0, 2.0, 6.0], dtype=torch.float64)
GR = torch.tensor([1.0, 3.0, 2.0, 2.0, 8.0], dtype=torch.float64)
GID = torch.tensor([7, 7, 5, 5, 5])


def build(name: str, **kw: float):
    return BASELINES.build(name, **kw)


def test_batch_mean_and_none_hand_values() -> None:
    """R = [1, 2, 6]: mean 3, so batch_mean gives [-2, -1, 3]; none returns R itself."""
    assert build("batch_mean")(R, None).tolist() == [-2.0, -1.0, 3.0]
    assert build("none")(R, None).tolist() == [1.0, 2.0, 6.0]


def test_batch_mean_std_population_std() -> None:
    """Centred [-2, -1, 3]; population variance (4 + 1 + 9) / 3 = 14/3; A = c / (sqrt(14/3) +
    eps)."""
    eps = 1e-3
    std = math.sqrt(14.0 / 3.0)
    got = build("batch_mean_std", eps=eps)(R, None)
    assert got.tolist() == pytest.approx([c / (std + eps) for c in (-2.0, -1.0, 3.0)], rel=1e-14)


def test_group_mean_hand_values() -> None:
    """Group 7 = {1, 3} (mean 2) -> [-1, 1]; group 5 = {2, 2, 8} (mean 4) -> [-2, -2, 4]."""
    assert build("group_mean")(GR, GID).tolist() == [-1.0, 1.0, -2.0, -2.0, 4.0]


def test_group_mean_std_unbiased_hand_values() -> None:
    """Unbiased std: group 7 sqrt((1 + 1) / 1) = sqrt 2; group 5 sqrt((4 + 4 + 16) / 2) = sqrt
    12."""
    eps = 1e-6
    s7, s5 = math.sqrt(2.0), math.sqrt(12.0)
    expected = [-1 / (s7 + eps), 1 / (s7 + eps), -2 / (s5 + eps), -2 / (s5 + eps), 4 / (s5 + eps)]
    assert build("group_mean_std")(GR, GID).tolist() == pytest.approx(expected, rel=1e-14)


def test_rloo_hand_values() -> None:
    """Leave-one-out: 1 - 3 = -2, 3 - 1 = 2; 2 - (2 + 8)/2 = -3 (twice), 8 - (2 + 2)/2 = 6."""
    assert build("rloo")(GR, GID).tolist() == [-2.0, 2.0, -3.0, -3.0, 6.0]


@pytest.mark.parametrize("name", ["group_mean", "group_mean_std", "rloo"])
def test_single_member_group_raises_naming_the_group(name: str) -> None:
    with pytest.raises(ValueError, match=r"group id\(s\) \[42\]"):
        build(name)(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([3, 3, 42]))


@pytest.mark.parametrize("name", ["group_mean", "group_mean_std", "rloo"])
def test_group_ids_required_and_checked(name: str) -> None:
    baseline = build(name)
    r = torch.tensor([1.0, 0.0])
    with pytest.raises(ValueError, match="group_ids"):
        baseline(r, None)
    with pytest.raises(ValueError, match="group_ids"):
        baseline(r, torch.tensor([1, 1, 1]))
    with pytest.raises(ValueError, match="group_ids must be an integer"):
        baseline(r, torch.tensor([1.0, 1.0]))


@pytest.mark.parametrize("name", [n for n in BASELINES.names() if n != "none"])
@pytest.mark.parametrize("value", [0.1, 1.0 / 3.0, 7.3])
def test_equal_rewards_give_exact_zero(name: str, value: float) -> None:
    """Equal rewards (also inside every group) give advantages that are exactly 0, not an ulp.

    In float32, 6 x 7.3 - mean is 4.8e-7 with the naive formula (0.48 after whitening)."""
    r = torch.full((6,), value, dtype=torch.float32)
    a = build(name)(r, torch.tensor([0, 0, 1, 1, 2, 2]))
    assert torch.equal(a, torch.zeros(6))


@pytest.mark.parametrize("name", BASELINES.names())
def test_detached_and_dtype(name: str) -> None:
    """No gradient into rewards; float64 stays float64, bf16 is computed in float32."""
    gid = torch.tensor([0, 0, 1, 1])
    r64 = torch.tensor([1.0, 0.0, 2.0, 5.0], dtype=torch.float64, requires_grad=True)
    a = build(name)(r64, gid)
    assert a.dtype == torch.float64 and not a.requires_grad
    a16 = build(name)(r64.detach().to(torch.bfloat16), gid)
    assert a16.dtype == torch.float32
    torch.testing.assert_close(a16, build(name)(r64.detach().float(), gid))


@pytest.mark.parametrize("name", ["batch_mean_std", "group_mean_std"])
@pytest.mark.parametrize("eps", [0.0, -1.0, float("nan"), "1e-6", True])
def test_eps_validation(name: str, eps: object) -> None:
    with pytest.raises(ValueError, match=rf"{name}\.eps"):
        build(name, eps=eps)
