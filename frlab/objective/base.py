"""Call signatures shared by every component of a kind, and their registries.

One signature per kind; components receive tensors plus their own hyperparameters (given to
the constructor), never a whole config.

- Baseline:     (rewards [B], group_ids [B]) -> advantages [B] (detached)
- TrustRegion:  (log_probs [B,T], behavior_log_probs [B,T], advantages [B], action_mask [B,T])
                -> TrustRegionOutput(weights [B,T], admitted [B], diagnostics)
- TokenFilter:  (action_mask [B,T], entropies [B,T] | None, failures [B] | None) -> keep [B,T]
- Aggregation:  (token_terms [B,T], keep [B,T], action_mask [B,T], *, num_sequences, num_tokens)
                -> scalar loss, normalised by the GLOBAL batch (num_sequences = global B,
                num_tokens = global policy-token count) so micro-batch losses sum to the
                full-batch loss.

The per-token loss term is `-weights * A_i * log_probs`; `weights` are detached, so the
gradient per kept token is `-weights * A_i / normaliser`.

Components also expose class attributes the `Objective` reads: `Baseline.is_group`,
`TrustRegion.off_policy_correction`, `TokenFilter.needs_entropies`. Shared numerics helpers:
`compute_dtype` (SPEC §2 rule 6) and `count_per_row` (T_i).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from frlab.registry import Registry


@dataclass
class TrustRegionOutput:
    """Detached per-token weights (rho or a corrected ratio), the admission mask, diagnostics.

    `admitted [B]` is the sequence-level decision. A token-level gate also sets
    `token_admitted [B,T]` (bool); when it is None the gate is `admitted[:, None]`.
    """

    weights: torch.Tensor
    admitted: torch.Tensor
    diagnostics: dict[str, torch.Tensor] = field(default_factory=dict)
    token_admitted: torch.Tensor | None = None


def count_per_row(mask: torch.Tensor) -> torch.Tensor:
    """Number of True entries per row [B] (int64) of a bool [B,T] mask.

    Summed as bytes into int32 (exact for T < 2**31): a plain bool `.sum` first converts the
    whole mask to int64, which costs a full extra pass on CPU.
    """
    return mask.view(torch.uint8).sum(dim=1, dtype=torch.int32).long()


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float64 if any given tensor is float64, else float32 (SPEC §2 rule 6: bf16/fp16 -> fp32)."""
    if any(t is not None and t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


class Baseline(Protocol):
    def __call__(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor: ...


class TrustRegion(Protocol):
    def __call__(
        self,
        log_probs: torch.Tensor,
        behavior_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        action_mask: torch.Tensor,
    ) -> TrustRegionOutput: ...


class TokenFilter(Protocol):
    def __call__(
        self,
        action_mask: torch.Tensor,
        entropies: torch.Tensor | None,
        failures: torch.Tensor | None,
    ) -> torch.Tensor: ...


class Aggregation(Protocol):
    def __call__(
        self,
        token_terms: torch.Tensor,
        keep: torch.Tensor,
        action_mask: torch.Tensor,
        *,
        num_sequences: int,
        num_tokens: int,
    ) -> torch.Tensor: ...


BASELINES: Registry[type] = Registry("baseline")
TRUST_REGIONS: Registry[type] = Registry("trust_region")
AGGREGATIONS: Registry[type] = Registry("aggregation")
TOKEN_FILTERS: Registry[type] = Registry("token_filter")
