"""Per-update training metrics, synchronised across data-parallel ranks with torchmetrics.

Every value is a statistic of the one learner batch of an update (nothing is averaged over
updates): rows are accumulated with `update_rows` (per micro-batch or per rank-local batch),
`compute` syncs the states of all ranks (torchmetrics gathers them when a process group is up)
and `reset` clears them for the next update. Policy lag follows the FlashREINFORCE paper: the
learner version at the update minus the version that generated a trajectory's OLDEST action
token (a trajectory may span several versions).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torchmetrics import MaxMetric, MeanMetric

# Metric names, one scheme for every logger (see frlab/config/SCHEMA.md).
REWARD = "train/reward_mean"
ACCEPTANCE = "train/acceptance_rate"
SEQUENCE_KL = "train/sequence_kl_mean"
LAG_MEAN = "train/policy_lag_mean"
LAG_MAX = "train/policy_lag_max"
RESPONSE_TOKENS = "train/response_tokens_mean"
ADVANTAGE_ABS = "train/advantage_abs_mean"
RETAINED_FRAC = "train/retained_tokens_frac"
TURNS = "train/turns_mean"
TOOL_CALLS = "train/tool_calls_mean"
LOSS = "train/loss"
GRAD_NORM = "train/grad_norm"
LR = "train/lr"
ZERO_SIGNAL = "train/zero_signal_step"  # 1 when the update's gradient was exactly 0
MICRO_BATCHES = "train/micro_batches"  # forward/backward passes per rank (0: work skipped)
STEP_S = "timing/step_s"
LOGPROB_S = "timing/logprob_s"
BACKWARD_S = "timing/backward_s"

PROGRESS_BAR = (REWARD, ACCEPTANCE, LAG_MEAN)
EPISODE_KEYS = (TURNS, TOOL_CALLS)
MEAN_KEYS = (
    REWARD,
    ACCEPTANCE,
    SEQUENCE_KL,
    LAG_MEAN,
    RESPONSE_TOKENS,
    ADVANTAGE_ABS,
    RETAINED_FRAC,
)


def policy_lag(policy_version: int, token_versions: torch.Tensor, action_mask: torch.Tensor):
    """Per-trajectory lag [B]: `policy_version - min over action tokens of token_versions`."""
    sentinel = torch.iinfo(torch.long).max
    oldest = torch.where(action_mask, token_versions.long(), sentinel).min(dim=1).values
    if bool((oldest == sentinel).any()):
        raise ValueError("RolloutBatch.action_mask has a row with no action token")
    return policy_version - oldest


class StepMetrics(nn.Module):
    """Batch statistics of one update; `compute()` returns globally reduced floats."""

    def __init__(self) -> None:
        super().__init__()
        # nan_strategy="error": a NaN statistic is a bug upstream, not something to hide.
        self.means = nn.ModuleDict({key: MeanMetric(nan_strategy="error") for key in MEAN_KEYS})
        self.lag_max = MaxMetric(nan_strategy="error")
        # Episode shape (agent-loop info): only batches built by `collate` carry it.
        self.episode = nn.ModuleDict(
            {key: MeanMetric(nan_strategy="error") for key in EPISODE_KEYS}
        )
        self._has_episode_rows = False

    def _mean(self, key: str) -> MeanMetric:
        return self.means[key]

    def update_rows(
        self,
        *,
        rewards: torch.Tensor,
        lag: torch.Tensor,
        response_tokens: torch.Tensor,
    ) -> None:
        """Rows known before the forward pass (rank-local batch)."""
        self._mean(REWARD).update(rewards.detach().float())
        self._mean(LAG_MEAN).update(lag.detach().float())
        self.lag_max.update(lag.detach().float())
        self._mean(RESPONSE_TOKENS).update(response_tokens.detach().float())

    def update_episodes(self, infos: list[dict]) -> None:
        """Turns and tool calls per trajectory (the agent loop's `Trajectory.info`)."""
        fields = ((TURNS, "turns"), (TOOL_CALLS, "tool_calls"))
        if not infos or any(field not in info for info in infos for _, field in fields):
            return  # hand-built batches carry no agent-loop info: log nothing rather than 0
        for key, field in fields:
            values = torch.tensor([float(info[field]) for info in infos])
            self.episode[key].update(values.to(self.lag_max.device))
        self._has_episode_rows = True

    def update_diagnostics(self, diagnostics: dict[str, torch.Tensor]) -> None:
        """Rows from the objective's diagnostics of one micro-batch."""
        admitted = diagnostics["admitted"].detach().float()
        self._mean(ACCEPTANCE).update(admitted)
        self._mean(SEQUENCE_KL).update(diagnostics["sequence_kl"].detach().float())
        self._mean(ADVANTAGE_ABS).update(diagnostics["advantages"].detach().float().abs())
        policy = diagnostics["policy_tokens"].detach().float()
        retained = diagnostics["retained_tokens"].detach().float()
        # Weighted by policy tokens: sum(retained) / sum(policy) over the global batch.
        self._mean(RETAINED_FRAC).update(retained / policy, weight=policy)

    def compute(self) -> dict[str, float]:
        """Reduced values; NaN for a statistic nothing fed this update (no forward ran), so a
        logger never repeats the previous update's value."""
        values = {
            key: float(metric.compute()) if metric.update_count else math.nan
            for key, metric in self.means.items()
        }
        values[LAG_MAX] = float(self.lag_max.compute())
        if self._has_episode_rows:
            values.update({key: float(m.compute()) for key, m in self.episode.items()})
        return values

    def reset(self) -> None:
        for metric in self.means.values():
            metric.reset()
        self.lag_max.reset()
        for metric in self.episode.values():
            metric.reset()
        self._has_episode_rows = False
