"""Micro-batch planning: row and token caps, packed vs padded cost, rank-equal counts."""

from __future__ import annotations

import random

import pytest

from frlab.learner.micro_batches import micro_batch_cost, plan_micro_batches


def _covers_each_row_once(plan: list[list[int]], n: int) -> bool:
    return sorted(i for rows in plan for i in rows) == list(range(n))


def test_without_a_budget_rows_are_cut_in_batch_order() -> None:
    assert plan_micro_batches([5, 1, 9, 2, 7], max_rows=2) == [[0, 1], [2, 3], [4]]
    assert plan_micro_batches([5, 1, 9], max_rows=8, packed=False) == [[0, 1, 2]]


def test_packed_budget_is_first_fit_decreasing_by_hand() -> None:
    # Longest first: 9 -> A; 7 -> B (16 > 10); 5 -> C; 2 -> A (11 > 10) no, B (9) yes;
    # 1 -> A (10) yes.  A = {9, 1}, B = {7, 2}, C = {5}.
    lengths = [5, 1, 9, 2, 7]
    plan = plan_micro_batches(lengths, max_rows=8, max_tokens=10, packed=True)
    assert plan == [[1, 2], [3, 4], [0]]


def test_padded_budget_counts_rows_times_longest_by_hand() -> None:
    # Budget 12, padded: 9 -> A (9); 7 -> A would cost 2 x 9 = 18: B (7); 5 -> B 2 x 7 = 14: C;
    # 2 -> C 2 x 5 = 10: yes; 1 -> C 3 x 5 = 15: no; D... no: A? 2 x 9 = 18, B? 2 x 7 = 14: D.
    lengths = [5, 1, 9, 2, 7]
    plan = plan_micro_batches(lengths, max_rows=8, max_tokens=12, packed=False)
    assert plan == [[2], [4], [0, 3], [1]]


@pytest.mark.parametrize("packed", [True, False])
def test_random_plans_respect_both_caps(packed: bool) -> None:
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 40)
        lengths = [rng.randint(1, 300) for _ in range(n)]
        max_rows, budget = rng.randint(1, 8), rng.randint(1, 900)
        plan = plan_micro_batches(lengths, max_rows=max_rows, max_tokens=budget, packed=packed)
        assert _covers_each_row_once(plan, n)
        for rows in plan:
            assert len(rows) <= max_rows and rows == sorted(rows)
            cost = micro_batch_cost([lengths[i] for i in rows], packed=packed)
            assert cost <= budget or len(rows) == 1  # a row longer than the budget stands alone


def test_a_row_longer_than_the_budget_gets_its_own_micro_batch() -> None:
    assert plan_micro_batches([50, 3, 4], max_rows=4, max_tokens=10) == [[0], [1, 2]]


def test_min_count_halves_the_largest_micro_batches() -> None:
    lengths = [8, 7, 6, 5, 4, 3]
    plan = plan_micro_batches(lengths, max_rows=6, max_tokens=100, min_count=3)
    assert len(plan) == 3 and _covers_each_row_once(plan, 6)
    # One micro-batch of 6 -> {8, 6, 4} + {7, 5, 3}; the costlier {8, 6, 4} splits in place.
    assert plan == [[0, 4], [2], [1, 3, 5]]
    assert len(plan_micro_batches([1, 2, 3], max_rows=1, min_count=3)) == 3


def test_costs() -> None:
    assert micro_batch_cost([3, 9, 4], packed=True) == 16
    assert micro_batch_cost([3, 9, 4], packed=False) == 27
    assert micro_batch_cost([], packed=False) == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_rows": 0}, r"data\.micro_batch_size"),
        ({"max_rows": 2, "max_tokens": 0}, r"data\.max_tokens_per_micro_batch"),
        ({"max_rows": 2, "max_tokens": True}, r"data\.max_tokens_per_micro_batch"),
        ({"max_rows": 2, "min_count": 4}, "3 rows"),
    ],
)
def test_bad_caps_name_the_config_key(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        plan_micro_batches([1, 2, 3], **kwargs)


def test_bad_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="positive ints"):
        plan_micro_batches([3, 0], max_rows=2)
