"""Micro-batch planning: which trajectories of a learner batch share one forward/backward.

Learner batches are ragged (long chain-of-thought lengths vary tenfold within a batch), so
fixed-row micro-batches padded to their longest row spend most of their compute on padding.
`plan_micro_batches` groups rows under two caps: at most `max_rows` rows, and, when
`max_tokens` is set, at most `max_tokens` tokens, counted as the model will compute them:

- packed (`packed=True`): the rows are concatenated into one padding-free row, so a micro-batch
  costs the sum of its lengths;
- padded: the rows are right-padded to the longest one, so it costs rows x longest.

With a token budget, rows are placed longest first into the first micro-batch that still fits
(first-fit decreasing), which also keeps similar lengths together when padded. A row longer than
the budget gets a micro-batch of its own (a trajectory is never split). Without a budget, rows
are cut into consecutive chunks of `max_rows` in batch order.

The plan never changes the update: the objective normalises by global counts, so micro-batch
losses and gradients sum to the full-batch ones whatever the grouping. `min_count` lets
data-parallel ranks agree on one number of micro-batches (FSDP2 gathers parameters in every
micro-batch's forward, so all ranks must run the same number): micro-batches with the most
rows are halved until there are `min_count` of them.
"""

from __future__ import annotations

from collections.abc import Sequence


def micro_batch_cost(lengths: Sequence[int], *, packed: bool) -> int:
    """Tokens the model computes for rows of these lengths: their sum packed, else rows x max."""
    if not lengths:
        return 0
    return sum(lengths) if packed else len(lengths) * max(lengths)


def _check_positive(name: str, value: int | None, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def plan_micro_batches(
    lengths: Sequence[int],
    *,
    max_rows: int,
    max_tokens: int | None = None,
    packed: bool = True,
    min_count: int = 1,
) -> list[list[int]]:
    """Row indices of each micro-batch (ascending within one); every row appears exactly once.

    lengths: real (unpadded) length of each row. See the module docstring for the rules.
    """
    _check_positive("max_rows (data.micro_batch_size)", max_rows)
    _check_positive("max_tokens (data.max_tokens_per_micro_batch)", max_tokens, optional=True)
    _check_positive("min_count", min_count)
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lengths):
        raise ValueError(f"row lengths must be positive ints, got {list(lengths)!r}")
    if min_count > len(lengths):
        raise ValueError(f"cannot make {min_count} micro-batches from {len(lengths)} rows")
    if max_tokens is None:
        plan = [
            list(range(i, min(i + max_rows, len(lengths))))
            for i in range(0, len(lengths), max_rows)
        ]
    else:
        plan = _first_fit_decreasing(lengths, max_rows, max_tokens, packed)
    while len(plan) < min_count:
        plan = _split_largest(plan, lengths, packed)
    return [sorted(rows) for rows in plan]


def _first_fit_decreasing(
    lengths: Sequence[int], max_rows: int, max_tokens: int, packed: bool
) -> list[list[int]]:
    """Longest rows first, each into the first micro-batch where it still fits both caps."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    plan: list[list[int]] = []
    sums: list[int] = []
    for i in order:
        n = lengths[i]
        for k, rows in enumerate(plan):
            # Rows arrive longest first, so a padded micro-batch's width is its first row's.
            cost = sums[k] + n if packed else (len(rows) + 1) * lengths[rows[0]]
            if len(rows) < max_rows and cost <= max_tokens:
                rows.append(i)
                sums[k] += n
                break
        else:
            plan.append([i])
            sums.append(n)
    return plan


def _split_largest(plan: list[list[int]], lengths: Sequence[int], packed: bool) -> list[list[int]]:
    """Halve the micro-batch with the most rows (ties: the costliest, then the first)."""
    candidates = [k for k, rows in enumerate(plan) if len(rows) > 1]
    k = max(
        candidates,
        key=lambda j: (
            len(plan[j]),
            micro_batch_cost([lengths[i] for i in plan[j]], packed=packed),
            -j,
        ),
    )
    rows = sorted(plan[k], key=lambda i: (-lengths[i], i))
    # Alternate rows by length so both halves cost about the same.
    first, second = rows[0::2], rows[1::2]
    return [*plan[:k], first, second, *plan[k + 1 :]]
