"""Shared random inputs for the objective tests (tiny, seeded, NaN in masked slots)."""

from __future__ import annotations

import torch
from torch import Tensor


def make_batch(
    b: int = 6,
    t: int = 9,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    drift: float = 0.05,
    nan_masked: bool = True,
) -> dict[str, Tensor]:
    """Random policy/behaviour log-probs (<= 0), bool mask with >= 1 policy token per row,
    integer-valued rewards, entropies with ties, failure flags and prompt-group ids (pairs)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, t, generator=g) < 0.7
    mask[torch.arange(b), torch.randint(0, t, (b,), generator=g)] = True
    behavior = -(torch.rand(b, t, generator=g, dtype=torch.float64) * 3.0)
    current = (behavior + drift * torch.randn(b, t, generator=g, dtype=torch.float64)).clamp_max(0)
    fill = float("nan") if nan_masked else 0.0
    return {
        "log_probs": torch.where(mask, current, fill).to(dtype),
        "behavior_log_probs": torch.where(mask, behavior, fill).to(dtype),
        "action_mask": mask,
        "rewards": torch.randint(0, 3, (b,), generator=g).to(dtype),
        "entropies": torch.where(mask, torch.randint(0, 4, (b, t), generator=g) * 0.5, fill).to(
            dtype
        ),
        "failures": torch.rand(b, generator=g) < 0.6,
        "group_ids": torch.arange(b) // 2,
    }
