"""One rank's learner batch as micro-batches, and what one micro-batch's forward runs under.

`split_batch` plans the micro-batches (frlab.data.packing: row and token caps, packed or
padded cost) and cuts the rows out, each trimmed to its own longest row. `forward_context`
holds, for the forward AND the backward of one micro-batch (activation checkpointing recomputes
the forward inside the backward): MoE routing replay of the recorded experts (packed into the
same single row as the tokens when packing), and per-trajectory attention for packed rows
(frlab.model.packed_attention).

`contributes` says which rows can move the policy: a row whose advantage is 0, or none of
whose tokens survive the trust region and the token filter, has a loss term that is exactly 0
with an exactly zero gradient (the objective selects kept, gated terms with `torch.where`; the
weights of gated-out tokens are 0).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch
from torch import Tensor, nn

from frlab.data.batch import RolloutBatch
from frlab.data.packing import plan_micro_batches
from frlab.learner.settings import MicroBatching
from frlab.model.packed_attention import packed_attention
from frlab.model.routing_replay import replay_routing


def micro_batch_plan(
    batch: RolloutBatch, how: MicroBatching, min_count: int = 1
) -> list[list[int]]:
    """Row indices of each micro-batch of `batch` (see frlab.data.packing)."""
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


@contextlib.contextmanager
def forward_context(
    policy: nn.Module, mb: RolloutBatch, *, pack: bool, routing_replay: bool
) -> Iterator[None]:
    """Routing replay and packed attention for the forward and backward of `mb`."""
    with contextlib.ExitStack() as stack:
        if routing_replay:
            if mb.routing is None:
                raise ValueError("model.routing_replay=true but a micro-batch has no routing")
            routing = mb.routing[mb.attention_mask].unsqueeze(0) if pack else mb.routing
            stack.enter_context(replay_routing(policy, routing))
        if pack:
            stack.enter_context(packed_attention(policy))
        yield


def contributes(diagnostics: Mapping[str, Tensor]) -> Tensor:
    """Bool [b]: rows whose loss term can be non-zero (advantage != 0 and a retained token)."""
    return (diagnostics["advantages"] != 0) & (diagnostics["retained_tokens"] > 0)
