"""Aggregations: per-token loss terms [B,T] -> one scalar, with GLOBAL normalisers.

- `sample_mean` (the FlashREINFORCE paper's Sample-Mean Optimization):
  (1/B) sum_i (1/T_i) sum_{t kept} term_{i,t} with T_i the ORIGINAL number of policy tokens of row i
  and B = `num_sequences`. Every
  trajectory weighs the same, so long failed trajectories do not dominate the update.
- `token_mean` (DAPO-style token-level loss): sum of kept terms / `num_tokens`, the global
  count of policy tokens.
- `constant_length` (Dr. GRPO, Liu et al. 2025): (1/B) sum_i (1/L) sum_{t kept} term_{i,t},
  with a fixed L (the generation budget) instead of T_i.

`num_sequences` / `num_tokens` describe the whole learner batch (all micro-batches and ranks),
so micro-batch losses SUM to the full-batch loss and their gradients to its gradient. Terms
are selected with `torch.where`, never multiplied by a 0/1 mask, so NaN/inf in dropped slots
reach neither the loss nor the gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from frlab.objective.base import AGGREGATIONS, Aggregation, count_per_row, hyperparameter
from frlab.objective.validation import check_count


def _normaliser(value: int | Tensor, name: str) -> int | Tensor:
    """Python ints are checked (> 0); a tensor (e.g. all-reduced on device) is used as is."""
    return value if isinstance(value, Tensor) else check_count(value, name)


def kept_row_sums(token_terms: Tensor, keep: Tensor) -> Tensor:
    """sum_{t kept} term_{i,t} per row [B]."""
    return torch.where(keep, token_terms, 0.0).sum(dim=1)


@AGGREGATIONS.register("sample_mean")
@dataclass(frozen=True)
class SampleMean(Aggregation):
    """Mean within each trajectory (original `T_i`), then over B."""

    source = "FlashREINFORCE (Sample-Mean Optimization)"

    def __call__(
        self,
        token_terms: Tensor,
        keep: Tensor,
        action_mask: Tensor,
        *,
        num_sequences: int | Tensor,
        num_tokens: int | Tensor,
    ) -> Tensor:
        b = _normaliser(num_sequences, "num_sequences")
        t_i = count_per_row(action_mask)
        return (kept_row_sums(token_terms, keep) / t_i).sum() / b


@AGGREGATIONS.register("token_mean")
@dataclass(frozen=True)
class TokenMean(Aggregation):
    """One mean over all policy tokens of the global batch."""

    source = "DAPO (Yu et al., 2025)"

    def __call__(
        self,
        token_terms: Tensor,
        keep: Tensor,
        action_mask: Tensor,
        *,
        num_sequences: int | Tensor,
        num_tokens: int | Tensor,
    ) -> Tensor:
        n = _normaliser(num_tokens, "num_tokens")
        return torch.where(keep, token_terms, 0.0).sum() / n


@AGGREGATIONS.register("constant_length")
@dataclass(frozen=True)
class ConstantLength(Aggregation):
    """Per-trajectory token sum / `length`, then mean over B."""

    source = "Dr. GRPO (Liu et al., 2025)"
    length: int = hyperparameter(4096, low=1, doc="fixed normaliser L (the generation budget)")

    def __call__(
        self,
        token_terms: Tensor,
        keep: Tensor,
        action_mask: Tensor,
        *,
        num_sequences: int | Tensor,
        num_tokens: int | Tensor,
    ) -> Tensor:
        b = _normaliser(num_sequences, "num_sequences")
        return (kept_row_sums(token_terms, keep) / self.length).sum() / b
