"""Per-update training metrics, synchronised across data-parallel ranks with torchmetrics.

Every value is a statistic of the one learner batch of an update (nothing is averaged over
updates): `update_batch` takes the rank-local batch once per update, `update_diagnostics` the
objective's diagnostics of each micro-batch, `finish` syncs the states of all ranks
(torchmetrics gathers them when a process group is up), adds the step's scalars and resets for
the next update. Means are accumulated on device as weighted sums with no host sync per
update; a NaN statistic raises at `finish` (a bug upstream, not something to hide).

Policy lag (as the FlashREINFORCE paper defines it: learner version at the update minus the version
that
generated the tokens; a trajectory may span several versions): `train/policy_lag_mean` and
`_max` per trajectory, from its OLDEST action token; `train/policy_lag_token_mean` per action
token. Component diagnostics are logged under the names their declarations give
(`train/<component>/<name>[_mean]`, `frlab.objective.base.Diagnostic`); `train/acceptance_rate`
only for trust regions that can reject a trajectory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torchmetrics import MaxMetric, Metric

# Metric names, one scheme for every logger (see docs/configuration.md, "The run folder").
REWARD = "train/reward_mean"
ACCEPTANCE = "train/acceptance_rate"
SEQUENCE_KL = "train/sequence_kl_mean"
LAG_MEAN = "train/policy_lag_mean"
LAG_MAX = "train/policy_lag_max"
LAG_TOKEN_MEAN = "train/policy_lag_token_mean"
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
COMPILES = "train/compiles"  # model.compile: graphs compiled so far, recompiles included
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
    LAG_TOKEN_MEAN,
    RESPONSE_TOKENS,
    ADVANTAGE_ABS,
    RETAINED_FRAC,
)
TIMINGS = {"step": STEP_S, "logprob": LOGPROB_S, "backward": BACKWARD_S}


def policy_lag(
    policy_version: int, token_versions: torch.Tensor, action_mask: torch.Tensor
) -> torch.Tensor:
    """Per-trajectory lag [B]: `policy_version - min over action tokens of token_versions`."""
    sentinel = torch.iinfo(torch.long).max
    oldest = torch.where(action_mask, token_versions.long(), sentinel).min(dim=1).values
    if bool((oldest == sentinel).any()):
        raise ValueError("RolloutBatch.action_mask has a row with no action token")
    return policy_version - oldest


def token_lag_sums(
    policy_version: int, token_versions: torch.Tensor, action_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum over action tokens of the lag, number of action tokens), each [B]."""
    lag = torch.where(action_mask, policy_version - token_versions.long(), 0)
    return lag.sum(dim=1), action_mask.sum(dim=1)


class WeightedMean(Metric):
    """sum(value * weight) / sum(weight), summed across ranks; no host sync per update."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weight", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, value: torch.Tensor, weight: torch.Tensor | float = 1.0) -> None:
        value = value.detach().to(torch.float64)
        if not isinstance(weight, torch.Tensor):
            weight = torch.tensor(float(weight), dtype=torch.float64, device=value.device)
        weight = torch.broadcast_to(weight.detach().to(torch.float64), value.shape)
        self.total += (value * weight).sum()
        self.weight += weight.sum()

    def compute(self) -> torch.Tensor:
        return self.total / self.weight


class StepMetrics(nn.Module):
    """Batch statistics of one update; `finish()` returns globally reduced floats.

    `objective` (a `frlab.objective.Objective`) decides the component metrics: its trust
    region's declared diagnostics, and whether `train/acceptance_rate` means anything.
    """

    def __init__(self, objective: Any | None = None) -> None:
        super().__init__()
        self.report_acceptance = True if objective is None else bool(objective.reports_acceptance)
        diagnostics = () if objective is None else objective.diagnostics
        trust_region = "" if objective is None else objective.names["trust_region"]
        self._component = {d.name: (d.metric(trust_region), d.per) for d in diagnostics}
        keys = [k for k in MEAN_KEYS if k != ACCEPTANCE or self.report_acceptance]
        keys += [metric for metric, _ in self._component.values()]
        self.means = nn.ModuleDict({k: WeightedMean() for k in keys})
        self.lag_max = MaxMetric(nan_strategy="error")
        # Episode shape (agent-loop info): only batches built by `collate` carry it.
        self.episode = nn.ModuleDict({k: WeightedMean() for k in EPISODE_KEYS})
        self._has_episode_rows = False

    def _mean(self, key: str) -> WeightedMean:
        return self.means[key]

    def update_batch(self, batch: Any, policy_version: int) -> None:
        """Rows known before the forward pass (rank-local batch): reward, lag, length, episode."""
        mask = batch.action_mask
        lag = policy_lag(policy_version, batch.token_versions, mask)
        lag_sum, tokens = token_lag_sums(policy_version, batch.token_versions, mask)
        self.update_rows(rewards=batch.rewards, lag=lag, response_tokens=tokens)
        self._mean(LAG_TOKEN_MEAN).update(lag_sum.double() / tokens, weight=tokens)
        self.update_episodes(batch.infos)

    def update_rows(
        self, *, rewards: torch.Tensor, lag: torch.Tensor, response_tokens: torch.Tensor
    ) -> None:
        """Per-trajectory reward, lag and response length."""
        self._mean(REWARD).update(rewards)
        self._mean(LAG_MEAN).update(lag)
        self.lag_max.update(lag.detach().float())
        self._mean(RESPONSE_TOKENS).update(response_tokens)

    def update_episodes(self, infos: list[dict]) -> None:
        """Turns and tool calls per trajectory (the agent loop's `Trajectory.info`)."""
        fields = ((TURNS, "turns"), (TOOL_CALLS, "tool_calls"))
        if not infos or any(field not in info for info in infos for _, field in fields):
            return  # hand-built batches carry no agent-loop info: log nothing rather than 0
        for key, field in fields:
            values = torch.tensor([float(info[field]) for info in infos])
            self.episode[key].update(values.to(self.lag_max.device))
        self._has_episode_rows = True

    def update_diagnostics(self, diagnostics: Mapping[str, torch.Tensor]) -> None:
        """Rows from the objective's diagnostics of one micro-batch (no host sync)."""
        policy = diagnostics["policy_tokens"]
        if self.report_acceptance:
            self._mean(ACCEPTANCE).update(diagnostics["admitted"])
        self._mean(SEQUENCE_KL).update(diagnostics["sequence_kl"])
        self._mean(ADVANTAGE_ABS).update(diagnostics["advantages"].abs())
        # Weighted by policy tokens: sum(retained) / sum(policy) over the global batch.
        self._mean(RETAINED_FRAC).update(
            diagnostics["retained_tokens"].double() / policy, weight=policy
        )
        for name, (metric, per) in self._component.items():
            weight = policy.sum() if per == "token" else 1.0  # token means: exact global value
            self._mean(metric).update(diagnostics[name], weight=weight)

    def compute(self) -> dict[str, float]:
        """Globally reduced values of the metrics updated this step; ValueError naming a NaN."""
        tracked = {**self.means, LAG_MAX: self.lag_max}
        if self._has_episode_rows:
            tracked.update(self.episode)
        values = {key: float(m.compute()) for key, m in tracked.items() if m.update_count}
        nan = sorted(k for k, v in values.items() if math.isnan(v))
        if nan:
            raise ValueError(f"NaN training statistic(s) {nan}: a bug upstream of the metrics")
        # A statistic nothing fed this update (no forward ran: a skipped zero-signal batch) is
        # NaN: Lightning would otherwise hand the logger the previous update's value again.
        values.update({key: math.nan for key in self.means if key not in values})
        return values

    def reset(self) -> None:
        for metric in [*self.means.values(), self.lag_max, *self.episode.values()]:
            metric.reset()
        self._has_episode_rows = False

    def finish(
        self,
        *,
        loss: torch.Tensor,
        grad_norm: torch.Tensor,
        lr: float,
        timings: dict[str, float],
        zero_signal: bool = False,
        micro_batches: int = 0,
    ) -> dict[str, float]:
        """The step's values (batch statistics plus loss, grad norm, lr, the zero-signal flag,
        forward passes, timings); resets. A statistic nothing fed this update (no forward ran)
        is NaN, so no logger repeats the previous update's value."""
        values = self.compute()
        self.reset()
        values.update({LOSS: float(loss), GRAD_NORM: float(grad_norm), LR: float(lr)})
        values.update({ZERO_SIGNAL: float(zero_signal), MICRO_BATCHES: float(micro_batches)})
        values.update({name: float(timings[key]) for key, name in TIMINGS.items()})
        return values
