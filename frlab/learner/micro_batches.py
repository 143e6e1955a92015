"""Micro-batching: which trajectories of a learner batch share one forward/backward, and what
one micro-batch's forward runs under.

`MicroBatching` holds the settings (`data.micro_batch_size`, `data.max_tokens_per_micro_batch`,
`data.pack_sequences`).

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

`split_batch` plans the micro-batches (`plan_micro_batches`) and cuts the rows out, each
trimmed to its own longest row. `forward_context` holds, for the forward AND the backward of
one micro-batch (activation checkpointing recomputes the forward inside the backward): MoE
routing replay of the recorded experts (packed into the same single row as the tokens when
packing), and per-trajectory attention for packed rows (frlab.model.packed_attention).

`contributes` says which rows can move the policy: a row whose advantage is 0, or none of
whose tokens survive the trust region and the token filter, has a loss term that is exactly 0
with an exactly zero gradient (the objective selects kept, gated terms with `torch.where`; the
weights of gated-out tokens are 0).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from frlab.data.batch import RolloutBatch
from frlab.errors import ConfigError
from frlab.learner.distributed import reduce_across_ranks, world_of
from frlab.model.packed_attention import packed_attention
from frlab.model.routing_replay import replay_routing


@dataclass(frozen=True)
class MicroBatching:
    """How one rank's rows are split into micro-batches.

    max_rows: `data.micro_batch_size`; max_tokens: `data.max_tokens_per_micro_batch` (None: no
    token cap); pack: `data.pack_sequences` (each micro-batch runs as one padding-free row).
    """

    max_rows: int
    max_tokens: int | None
    pack: bool


# -- planning: which rows share one forward/backward ------------------------------------------
def micro_batch_cost(lengths: Sequence[int], *, packed: bool) -> int:
    """Tokens the model computes for rows of these lengths: their sum packed, else rows x max."""
    if not lengths:
        return 0
    return sum(lengths) if packed else len(lengths) * max(lengths)


def _check_positive(name: str, value: int | None, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(name, f"must be a positive int, got {value!r}")


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


# -- one rank's batch as micro-batches -------------------------------------------------------
def micro_batch_plan(
    batch: RolloutBatch, how: MicroBatching, min_count: int = 1
) -> list[list[int]]:
    """Row indices of each micro-batch of `batch` (see `plan_micro_batches`)."""
    lengths = [int(n) for n in batch.attention_mask.sum(dim=1).tolist()]
    return plan_micro_batches(
        lengths,
        max_rows=how.max_rows,
        max_tokens=how.max_tokens,
        packed=how.pack,
        min_count=min_count,
    )


def split_batch(
    batch: RolloutBatch, how: MicroBatching, min_count: int = 1
) -> list[tuple[Tensor, RolloutBatch]]:
    """(row index [b], trimmed micro-batch) pairs covering every row of `batch` once."""
    out = []
    for rows in micro_batch_plan(batch, how, min_count):
        index = torch.tensor(rows, dtype=torch.long, device=batch.input_ids.device)
        out.append((index, batch.select(index).trim()))
    return out


def agreed_count(module: Any, batch: RolloutBatch, how: MicroBatching) -> int:
    """The micro-batch count every rank of `module` uses: its own plan's, or the largest over
    ranks when a token budget makes plans differ (equal row caps give equal counts)."""
    world, _ = world_of(module)
    if world == 1 or how.max_tokens is None:
        return 1
    local = len(micro_batch_plan(batch, how))
    count = torch.tensor(local, dtype=torch.long, device=batch.input_ids.device)
    return int(reduce_across_ranks(module, count, "max").item())


@contextlib.contextmanager
def forward_context(
    policy: nn.Module, mb: RolloutBatch, *, pack: bool, routing_replay: bool
) -> Iterator[None]:
    """Routing replay and packed attention for the forward and backward of `mb`."""
    with contextlib.ExitStack() as stack:
        if routing_replay:
            if mb.routing is None:
                raise ConfigError(
                    "model.routing_replay",
                    "model.routing_replay=true but a micro-batch has no routing",
                )
            routing = mb.routing[mb.attention_mask].unsqueeze(0) if pack else mb.routing
            stack.enter_context(replay_routing(policy, routing))
        if pack:
            stack.enter_context(packed_attention(policy))
        yield


def contributes(diagnostics: Mapping[str, Tensor]) -> Tensor:
    """Bool [b]: rows whose loss term can be non-zero (advantage != 0 and a retained token)."""
    return (diagnostics["advantages"] != 0) & (diagnostics["retained_tokens"] > 0)
