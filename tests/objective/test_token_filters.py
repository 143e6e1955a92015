"""Token filters: hand-computed keeps, tie rule, python-like ceil, loop equivalence."""

from __future__ import annotations

import math

import pytest
import torch

from frlab.objective import TOKEN_FILTERS

# Row 0 failed: T_0 = 4 policy tokens, entropies (0.5, 2.0, 1.0, 2.0), last slot masked (NaN).
# Row 1 did not fail: it always keeps its policy tokens.
ENT = torch.tensor([[0.5, 2.0, 1.0, 2.0, float("nan")], [0.1, 0.2, 0.3, 0.4, 0.5]])
MASK = torch.tensor([[True, True, True, True, False], [True, True, False, True, True]])
FAIL = torch.tensor([True, False])


def keep(q: float, ent=ENT, mask=MASK, fail=FAIL) -> list[list[bool]]:  # noqa: ANN001
    return TOKEN_FILTERS.build("entropy_failures", q=q)(mask, ent, fail).tolist()


def test_none_keeps_the_mask() -> None:
    f = TOKEN_FILTERS.build("none")
    assert f(MASK, None, None) is MASK and not f.needs_entropies


def test_hand_values() -> None:
    """q = 0.5: ceil(2.0) = 2 -> the two 2.0 tokens (positions 1, 3). q = 0.6: ceil(2.4) = 3 ->
    adds 1.0 (position 2). q = 1: all 4. q = 0: none of row 0. Row 1 is untouched."""
    row1 = MASK[1].tolist()
    assert keep(0.5) == [[False, True, False, True, False], row1]
    assert keep(0.6) == [[False, True, True, True, False], row1]
    assert keep(1.0) == [MASK[0].tolist(), row1]
    assert keep(0.0) == [[False] * 5, row1]


@pytest.mark.parametrize(
    ("q", "expected"),
    [(0.25, [1, 0, 0, 0]), (0.5, [1, 1, 0, 0]), (0.75, [1, 1, 1, 0])],
)
def test_ties_go_to_the_earlier_position(q: float, expected: list[int]) -> None:
    """Four equal entropies: ceil(4q) tokens are kept, the earliest ones (both the keep-side,
    q < 1/2, and the drop-side, q >= 1/2, selections)."""
    ent = torch.ones(1, 4)
    got = keep(q, ent=ent, mask=torch.ones(1, 4, dtype=torch.bool), fail=torch.tensor([True]))
    assert got == [[bool(v) for v in expected]]


@pytest.mark.parametrize(("q", "t", "k"), [(0.07, 100, 8), (0.3, 50, 15), (0.9, 10, 9)])
def test_ceil_is_python_float64(q: float, t: int, k: int) -> None:
    """In float64 0.07 * 100 = 7.000000000000001, so python's math.ceil gives 8; 0.3 * 50 is
    exactly 15.0 (float32 would give 15.000001 -> 16). The filter keeps exactly that many."""
    assert math.ceil(q * t) == k
    ent = torch.arange(float(t)).flip(0).unsqueeze(0)
    got = keep(q, ent=ent, mask=torch.ones(1, t, dtype=torch.bool), fail=torch.tensor([True]))
    assert sum(got[0]) == k and got[0][:k] == [True] * k


def test_needs_entropies_and_missing_inputs() -> None:
    assert TOKEN_FILTERS.build("entropy_failures", q=0.9).needs_entropies
    assert not TOKEN_FILTERS.build("entropy_failures", q=1.0).needs_entropies
    with pytest.raises(ValueError, match="entropies"):
        TOKEN_FILTERS.build("entropy_failures", q=0.9)(MASK, None, FAIL)


@pytest.mark.parametrize("q", [-0.1, 1.5, float("nan"), "0.9"])
def test_q_validation(q: object) -> None:
    with pytest.raises(ValueError, match="entropy_failures.q"):
        TOKEN_FILTERS.build("entropy_failures", q=q)


def loop_keep(mask: torch.Tensor, ent: torch.Tensor, fail: torch.Tensor, q: float) -> list:
    """Obviously-correct reference: per row, sort policy positions by (-entropy, position)."""
    out = []
    for i in range(mask.shape[0]):
        positions = [t for t in range(mask.shape[1]) if mask[i, t]]
        row = [bool(v) for v in mask[i]]
        if fail[i]:
            k = math.ceil(q * len(positions))
            ranked = sorted(positions, key=lambda t: (-float(ent[i, t]), t))
            chosen = set(ranked[:k])
            row = [t in chosen for t in range(mask.shape[1])]
        out.append(row)
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("q", [0.0, 0.1, 0.2, 0.3, 0.49, 0.5, 0.7, 0.9, 0.95, 1.0])
def test_matches_loop_reference(seed: int, q: float) -> None:
    """Random masks, heavily tied entropies (4 values), random failures, both selection sides."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(7, 23, generator=g) < 0.6
    mask[:, 5] = True
    ent = (torch.randint(0, 4, (7, 23), generator=g) * 0.5).to(torch.float64)
    ent[~mask] = float("nan")
    fail = torch.rand(7, generator=g) < 0.7
    assert keep(q, ent=ent, mask=mask, fail=fail) == loop_keep(mask, ent, fail, q)
