"""Baselines: rewards [B] (+ group ids) -> detached advantages [B].

- `batch_mean`: the FlashREINFORCE paper's One-Batch REINFORCE, A_i = R_i - mean_j R_j over the
  whole learner batch, no std scaling. One rollout per prompt, so the batch is the only baseline
  there is.
- `none`: A_i = R_i (vanilla REINFORCE, no variance reduction).
- `batch_mean_std`: REINFORCE++ global whitening, (R_i - mean R) / (std R + eps), population std.
- `group_mean`: Dr. GRPO (Liu et al. 2025), R_i - mean of R over the prompt group of i.
- `group_mean_std`: GRPO (Shao et al. 2024, DeepSeekMath), (R_i - group mean) / (group std + eps)
  with the UNBIASED (n - 1) group std, as the original GRPO implementations compute it.
- `rloo`: REINFORCE leave-one-out (Ahmadian et al. 2024), R_i - mean of the OTHER members.

Numerics: rewards are first shifted by a reference reward (the first reward of the batch or of
the group). That leaves every advantage unchanged mathematically but makes equal rewards give
advantages that are EXACTLY zero (so equal rewards give a loss and gradient of exactly 0), where `R
- mean(R)` can be off by an ulp.
Group baselines refuse a group with a single member: several public frameworks silently return
zero advantages there, which stalls one-rollout-per-prompt training without a visible error.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from frlab.objective.base import BASELINES, Baseline, compute_dtype, hyperparameter


def _as_float(rewards: Tensor) -> Tensor:
    return rewards.detach().to(compute_dtype(rewards))


def _eps() -> float:
    return hyperparameter(1e-6, low=0.0, low_open=True, finite=True, doc="added to the std")


@dataclass
class Groups:
    """Group structure of a batch: `index [B]` into G groups, `counts [G]`, `first [G]` row."""

    index: Tensor
    counts: Tensor
    first: Tensor

    @staticmethod
    def of(group_ids: Tensor | None, rewards: Tensor, who: str) -> Groups:
        """Validate group ids (one integer id per row, >= 2 members per group) and index them."""
        if group_ids is None:
            raise ValueError(f"baseline {who!r} needs group_ids [B] (prompt ids), got None")
        if not isinstance(group_ids, Tensor) or group_ids.shape != rewards.shape:
            shape = list(group_ids.shape) if isinstance(group_ids, Tensor) else type(group_ids)
            raise ValueError(
                f"group_ids must be a tensor of shape {list(rewards.shape)}, got {shape}"
            )
        if group_ids.is_floating_point() or group_ids.is_complex() or group_ids.dtype == torch.bool:
            raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
        if group_ids.device != rewards.device:
            raise ValueError(f"group_ids is on {group_ids.device}, rewards on {rewards.device}")
        ids, index, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
        single = counts == 1
        if bool(single.any()):
            lonely = ids[single].tolist()
            raise ValueError(
                f"baseline {who!r} needs >= 2 samples per group, but group id(s) {lonely[:10]} "
                "have a single member (its advantage would silently be 0); use a batch baseline "
                "such as 'batch_mean' for one rollout per prompt, or sample more per prompt"
            )
        rows = torch.arange(index.numel(), device=index.device)
        first = torch.full_like(counts, index.numel()).scatter_reduce(
            0, index, rows, reduce="amin", include_self=True
        )
        return Groups(index=index, counts=counts, first=first)

    def shifted(self, r: Tensor) -> Tensor:
        """r minus its group's first reward: exact zeros inside a group of equal rewards."""
        return r - r[self.first][self.index]

    def sum(self, x: Tensor) -> Tensor:
        """Per-group sums [G] of a per-row tensor."""
        return torch.zeros(self.counts.shape, dtype=x.dtype, device=x.device).index_add_(
            0, self.index, x
        )

    def mean(self, x: Tensor) -> Tensor:
        """The group mean of `x`, broadcast back to rows [B]."""
        return (self.sum(x) / self.counts.to(x.dtype))[self.index]


@BASELINES.register("batch_mean")
@dataclass(frozen=True)
class BatchMean(Baseline):
    """`A_i = R_i - mean_j R_j` over the whole batch."""

    source = "FlashREINFORCE (One-Batch REINFORCE)"

    def __call__(self, rewards: Tensor, group_ids: Tensor | None = None) -> Tensor:
        s = _as_float(rewards)
        s = s - s[0]
        return s - s.mean()


@BASELINES.register("none")
@dataclass(frozen=True)
class NoBaseline(Baseline):
    """`A_i = R_i`."""

    source = "REINFORCE (Williams, 1992)"

    def __call__(self, rewards: Tensor, group_ids: Tensor | None = None) -> Tensor:
        return _as_float(rewards).clone()


@BASELINES.register("batch_mean_std")
@dataclass(frozen=True)
class BatchMeanStd(Baseline):
    """Batch-whitened rewards `(R_i - mean R) / (std R + eps)`, population std."""

    source = "REINFORCE++ (Hu, 2025)"
    eps: float = _eps()

    def __call__(self, rewards: Tensor, group_ids: Tensor | None = None) -> Tensor:
        s = _as_float(rewards)
        centred = (s - s[0]) - (s - s[0]).mean()
        std = centred.pow(2).mean().sqrt()
        return centred / (std + self.eps)


@BASELINES.register("group_mean")
@dataclass(frozen=True)
class GroupMean(Baseline):
    """Reward minus its prompt group's mean."""

    source = "Dr. GRPO (Liu et al., 2025)"
    is_group = True

    def __call__(self, rewards: Tensor, group_ids: Tensor | None = None) -> Tensor:
        s = _as_float(rewards)
        groups = Groups.of(group_ids, s, "group_mean")
        s = groups.shifted(s)
        return s - groups.mean(s)


@BASELINES.register("group_mean_std")
@dataclass(frozen=True)
class GroupMeanStd(Baseline):
    """Group-whitened rewards `(R_i - group mean) / (group std + eps)`, unbiased (n - 1) std."""

    source = "GRPO (Shao et al., 2024)"
    is_group = True
    eps: float = _eps()

    def __call__(self, rewards: Tensor, group_ids: Tensor | None = None) -> Tensor:
        s = _as_float(rewards)
        groups = Groups.of(group_ids, s, "group_mean_std")
        s = groups.shifted(s)
        centred = s - groups.mean(s)
        n = groups.counts.to(s.dtype)
        std = (groups.sum(centred.pow(2)) / (n - 1)).sqrt()[groups.index]
        return centred / (std + self.eps)


@BASELINES.register("rloo")
@dataclass(frozen=True)
class LeaveOneOut(Baseline):
    """Reward minus the mean of the *other* members of its group."""

    source = "RLOO (Ahmadian et al., 2024)"
    is_group = True

    def __call__(self, rewards: Tensor, group_ids: Tensor | None = None) -> Tensor:
        s = _as_float(rewards)
        groups = Groups.of(group_ids, s, "rloo")
        s = groups.shifted(s)
        n = groups.counts.to(s.dtype)[groups.index]
        others = (groups.sum(s)[groups.index] - s) / (n - 1)
        return s - others
