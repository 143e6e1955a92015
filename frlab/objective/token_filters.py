"""Token filters: (action_mask, entropies, failures) -> keep [B,T] bool.

- `none`: keep every policy token (keep = action_mask), the base method.
- `entropy_failures`: the FlashREINFORCE paper's optional entropy filter (negative-token
  fraction q). In rows flagged by `failures` (explicit labels, never the
  advantage sign) keep only the ceil(q * T_i) policy tokens with the highest entropy, ties
  going to the earlier position; other rows keep all.
  Long failed trajectories then push down only their most uncertain decisions instead of every
  token. The filter never changes the denominators: T_i and B stay the original counts.

Entropies are ranked in their own dtype (never cast first: a cast could create or break ties).
Vectorised over the failed rows, no Python loop over rows: one `topk` per batch finds each
row's entropy threshold, a cumulative sum over the tied tokens resolves ties by position.
For q >= 1/2 the (smaller) set of dropped tokens is selected instead of the kept one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from frlab.objective.base import TOKEN_FILTERS, TokenFilter, count_per_row, hyperparameter


@TOKEN_FILTERS.register("none")
@dataclass(frozen=True)
class KeepAll(TokenFilter):
    """Keep every policy token."""

    def __call__(
        self, action_mask: Tensor, entropies: Tensor | None = None, failures: Tensor | None = None
    ) -> Tensor:
        return action_mask


def token_budget(action_mask: Tensor, q: float) -> tuple[Tensor, Tensor]:
    """(T_i, k_i = ceil(q * T_i)) per row; k_i in float64 like python's math.ceil(q * T_i)."""
    t_i = count_per_row(action_mask)
    return t_i, torch.ceil(t_i.to(torch.float64) * q).to(torch.long)


def select_extreme(scores: Tensor, n: Tensor, *, largest: bool) -> Tensor:
    """bool [R,T]: the n_i largest (or smallest) scores of each row.

    Ties at the threshold go to the EARLIEST positions when `largest`, to the LATEST when not
    (so that "drop the n lowest, ties dropping the later token" complements "keep the highest,
    ties keeping the earlier token"). Slots that must never be chosen hold -inf (largest) or
    +inf (smallest); 0 <= n_i <= number of candidates of row i. One `topk` of the largest
    n_i gives each row's threshold; ties are ranked with a cumulative sum.
    """
    k_max = int(n.max()) if n.numel() else 0
    if k_max == 0:
        return torch.zeros_like(scores, dtype=torch.bool)
    values = scores.topk(k_max, dim=1, largest=largest, sorted=True).values
    threshold = values.gather(1, (n - 1).clamp_min(0).unsqueeze(1))
    strict = scores > threshold if largest else scores < threshold
    tie = scores == threshold
    need = n.unsqueeze(1) - strict.sum(dim=1, keepdim=True)
    rank = tie.cumsum(dim=1)  # 1-based rank among the tied slots, from the left
    chosen_tie = tie & (rank <= need if largest else rank > rank[:, -1:] - need)
    return (strict | chosen_tie) & (n.unsqueeze(1) > 0)


def top_entropy_tokens(action_mask: Tensor, entropies: Tensor, q: float) -> Tensor:
    """keep [R,T]: the ceil(q T_i) highest-entropy policy tokens of every row, ties earlier.

    For q >= 1/2 the complement is cheaper: drop the T_i - k_i lowest-entropy tokens, ties
    dropping the later position, which keeps exactly the same set.
    """
    t_i, k_i = token_budget(action_mask, q)
    ent = entropies.detach()
    if q < 0.5:
        return select_extreme(torch.where(action_mask, ent, -math.inf), k_i, largest=True)
    drop = select_extreme(torch.where(action_mask, ent, math.inf), t_i - k_i, largest=False)
    return action_mask & ~drop


@TOKEN_FILTERS.register("entropy_failures")
@dataclass(frozen=True)
class EntropyFailures(TokenFilter):
    """In failed trajectories keep the `ceil(q*T_i)` highest-entropy tokens."""

    source = "FlashREINFORCE (negative-token fraction q)"
    q: float = hyperparameter(
        1.0, low=0.0, high=1.0, doc="kept fraction of a failed trajectory's tokens (1: keep all)"
    )

    @property
    def needs_entropies(self) -> bool:
        """q = 1 keeps everything, so entropies and failures are only needed for q < 1."""
        return self.q < 1.0

    def __call__(
        self, action_mask: Tensor, entropies: Tensor | None = None, failures: Tensor | None = None
    ) -> Tensor:
        if not self.needs_entropies:
            return action_mask
        if entropies is None or failures is None:
            raise ValueError(
                f"token filter 'entropy_failures' (q={self.q}) needs entropies [B, T] and "
                "failures [B]; got None"
            )
        rows = failures.nonzero().squeeze(1)
        if rows.numel() == 0:
            return action_mask
        keep = action_mask.clone()
        keep[rows] = top_entropy_tokens(action_mask[rows], entropies[rows], self.q)
        return keep
