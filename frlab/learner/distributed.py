"""The learner's data-parallel collectives (DDP and FSDP2), as a LightningModule mixin.

Every helper is the identity on one process. With W ranks: rewards and prompt ids are gathered
rank-major (so the advantages are those of the global batch), counts are summed, flags and
micro-batch counts are maxed (so every rank takes the same branch: FSDP2 gathers parameters in
each forward and backward, so ranks must run the same micro-batches), and gradient sync runs
on the last micro-batch only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import Tensor

from frlab.learner.sharding import full_tensor


class DataParallelMixin:
    """Mixed into `FlashReinforceModule` (reads `_trainer`, `_scorer`, `grad_clip`)."""

    _trainer: Any
    _scorer: Any
    grad_clip: float
    policy_version: int

    def _world(self) -> tuple[int, int]:
        trainer = self._trainer
        if trainer is None:
            return 1, 0
        return trainer.world_size, trainer.global_rank

    def _gather_rows(self, x: Tensor) -> Tensor:
        """Rank-major concatenation of every rank's `x` [b] -> [W*b] (identity for W=1)."""
        world, _ = self._world()
        if world == 1:
            return x
        return self.all_gather(x).reshape(-1)

    def _sum_across_ranks(self, x: Tensor) -> Tensor:
        world, _ = self._world()
        if world == 1:
            return x
        return self.trainer.strategy.reduce(x.clone(), reduce_op="sum")

    @contextmanager
    def _grad_sync(self, enabled: bool) -> Iterator[None]:
        """Block DDP gradient all-reduce unless `enabled` (the last micro-batch)."""
        strategy = getattr(self._trainer, "strategy", None)
        if self._scorer is not None:  # FSDP2: skip the reduce-scatter until the last one
            self._scorer.set_requires_gradient_sync(enabled)  # type: ignore[operator]
            yield
            return
        block = getattr(strategy, "block_backward_sync", None)
        with nullcontext() if enabled or block is None else block():
            yield

    def _clip_gradients(self) -> Tensor:
        """Pre-clip total gradient norm; clips to optim.grad_clip (inf: measure only)."""
        params = [p for p in self.parameters() if p.grad is not None]
        # FSDP2: sharded (DTensor) gradients; the norm is global, its value gathered here.
        norm = full_tensor(torch.nn.utils.clip_grad_norm_(params, self.grad_clip))
        if not bool(torch.isfinite(norm)):
            raise FloatingPointError(
                f"non-finite gradient norm {float(norm)} at policy_version {self.policy_version}"
            )
        return norm.detach()

    def _max_across_ranks(self, x: Tensor) -> Tensor:
        world, _ = self._world()
        if world == 1:
            return x
        return self.trainer.strategy.reduce(x.clone(), reduce_op="max")
