"""The learner's data-parallel collectives (DDP and FSDP2), as functions of the module.

Every helper is the identity on one process. With W ranks: rewards and prompt ids are gathered
rank-major (so the advantages are those of the global batch), counts are summed, flags and
micro-batch counts are maxed (so every rank takes the same branch: FSDP2 gathers parameters in
each forward and backward, so ranks must run the same micro-batches), and gradient sync runs
on the last micro-batch only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import lightning as L
import torch
from torch import Tensor

from frlab.learner.sharding import full_tensor


def world_of(module: L.LightningModule) -> tuple[int, int]:
    """(world size, global rank) of the module's trainer; (1, 0) when it has none."""
    trainer = module._trainer
    if trainer is None:
        return 1, 0
    return trainer.world_size, trainer.global_rank


def gather_rows(module: L.LightningModule, x: Tensor) -> Tensor:
    """Rank-major concatenation of every rank's `x` [b] -> [W*b] (identity for W=1)."""
    if world_of(module)[0] == 1:
        return x
    return module.all_gather(x).reshape(-1)


def reduce_across_ranks(module: L.LightningModule, x: Tensor, op: str) -> Tensor:
    """`x` summed (`op="sum"`) or maxed (`op="max"`) over ranks (identity for W=1)."""
    if world_of(module)[0] == 1:
        return x
    return module.trainer.strategy.reduce(x.clone(), reduce_op=op)


@contextmanager
def grad_sync(module: L.LightningModule, scorer: Any, enabled: bool) -> Iterator[None]:
    """Block the gradient all-reduce unless `enabled` (the last micro-batch). `scorer` is the
    FSDP2-sharded scorer (its reduce-scatter is skipped instead), or None under DDP."""
    if scorer is not None:
        scorer.set_requires_gradient_sync(enabled)
        yield
        return
    block = getattr(getattr(module._trainer, "strategy", None), "block_backward_sync", None)
    with nullcontext() if enabled or block is None else block():
        yield


def clip_gradients(
    parameters: Iterable[torch.nn.Parameter], max_norm: float, version: int
) -> Tensor:
    """Pre-clip total gradient norm; clips to `max_norm` (inf: measure only). A non-finite
    norm raises FloatingPointError naming the policy version."""
    params = [p for p in parameters if p.grad is not None]
    # FSDP2: sharded (DTensor) gradients; the norm is global, its value gathered here.
    norm = full_tensor(torch.nn.utils.clip_grad_norm_(params, max_norm))
    if not bool(torch.isfinite(norm)):
        raise FloatingPointError(
            f"non-finite gradient norm {float(norm)} at policy_version {version}"
        )
    return norm.detach()
