"""StepMetrics: component diagnostics under stable names, exact across micro-batches; policy lag
per trajectory and per token; acceptance only where a trust region can reject."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.learner import learner_module
from helpers.learner_setup import (
    MODEL_CFG,
    OPTIM_CFG,
    MemoryLogger,
    loader,
    make_batch,
    naive_logprobs,
    tiny_policy,
    trainer,
)

from frlab.data.batch import Trajectory, collate
from frlab.learner import metrics
from frlab.learner.metrics import StepMetrics
from frlab.objective import Objective

L = math.log
# Two rows, behaviour p = 0.5 everywhere; rho = (1.5, 1) on row 0 (A = +0.5) and
# (0.5, 1, 1) on row 1 (A = -0.5). PPO clip 0.2: token (0, 0) (rho > 1.2, A > 0) and token
# (1, 0) (rho < 0.8, A < 0) are clipped: 2 of 5 policy tokens.
MASK = torch.tensor([[True, True, False], [True, True, True]])
BEH = torch.full((2, 3), L(0.5), dtype=torch.float64)
CUR = torch.log(0.5 * torch.tensor([[1.5, 1.0, 1.0], [0.5, 1.0, 1.0]], dtype=torch.float64))
REWARDS = torch.tensor([1.0, 0.0], dtype=torch.float64)


def _feed(objective: Objective, step: StepMetrics, row_groups: list[slice]) -> None:
    adv = objective.advantages(REWARDS)
    for rows in row_groups:
        _, diag = objective(
            CUR[rows], BEH[rows], adv[rows], MASK[rows], num_sequences=2, num_tokens=5
        )
        step.update_diagnostics(diag)


@pytest.mark.parametrize("split", [[slice(0, 2)], [slice(0, 1), slice(1, 2)]], ids=["one", "two"])
def test_ppo_clip_logs_its_clip_fraction_not_an_acceptance(split: list[slice]) -> None:
    """2 / 5 whether the batch comes in one piece or as micro-batches of 2 and 3 tokens
    (their unweighted mean would be (1/2 + 1/3) / 2 = 0.417)."""
    objective = Objective(trust_region="ppo_clip")
    step = StepMetrics(objective)
    _feed(objective, step, split)
    values = step.compute()
    assert values["train/ppo_clip/clip_fraction"] == pytest.approx(0.4, rel=1e-12)
    assert metrics.ACCEPTANCE not in values
    assert values[metrics.RETAINED_FRAC] == pytest.approx(1.0)


def test_row_diagnostics_are_row_means_and_gates_report_acceptance() -> None:
    """sequence_k3 per row: k3 = mean_t (rho - 1 - ln rho) over T_i, logged as the mean over
    rows; delta 0.05 admits row 0 (k3 0.0473) and rejects row 1 (0.0644): acceptance 0.5."""
    k3 = [
        (1.5 - 1 - L(1.5)) / 2,  # row 0: 0.0472674...
        (0.5 - 1 - L(0.5)) / 3,  # row 1: 0.0643823...
    ]
    objective = Objective(trust_region="sequence_k3", params={"sequence_k3": {"delta": 0.05}})
    step = StepMetrics(objective)
    _feed(objective, step, [slice(0, 1), slice(1, 2)])
    values = step.compute()
    assert values["train/sequence_k3/sequence_k3_mean"] == pytest.approx(sum(k3) / 2, rel=1e-12)
    assert values[metrics.ACCEPTANCE] == 0.5  # row 0 admitted (0.047 <= 0.05), row 1 not


def _trajectory(versions: list[int], reward: float) -> Trajectory:
    n = len(versions) + 1  # one prompt token, then the action tokens
    return Trajectory(
        token_ids=list(range(1, n + 1)),
        action_mask=[False] + [True] * (n - 1),
        behavior_log_probs=[0.0] + [-0.5] * (n - 1),
        token_versions=[-1, *versions],
        reward=reward,
        prompt_id=0,
        failure=False,
    )


def test_policy_lag_per_trajectory_and_per_token() -> None:
    """Learner version 5. Row 0 tokens from versions (3, 4): lag 2 (oldest token), token lags
    (2, 1). Row 1 from (4, 5, 5): lag 1, token lags (1, 0, 0). Per trajectory: mean 1.5, max 2;
    per token: (2 + 1 + 1 + 0 + 0) / 5 = 0.8."""
    batch = collate([_trajectory([3, 4], 1.0), _trajectory([4, 5, 5], 0.0)])
    step = StepMetrics()
    step.update_batch(batch, policy_version=5)
    values = step.compute()
    assert values[metrics.LAG_MEAN] == 1.5 and values[metrics.LAG_MAX] == 2.0
    assert values[metrics.LAG_TOKEN_MEAN] == pytest.approx(0.8, rel=1e-12)
    assert values[metrics.RESPONSE_TOKENS] == 2.5 and values[metrics.REWARD] == 0.5


def test_a_nan_statistic_raises_at_compute_naming_it() -> None:
    step = StepMetrics()
    step.update_rows(
        rewards=torch.tensor([1.0, math.nan]),
        lag=torch.tensor([0, 1]),
        response_tokens=torch.tensor([2, 3]),
    )
    with pytest.raises(ValueError, match="train/reward_mean"):
        step.compute()


def test_the_learner_logs_the_component_diagnostics_and_token_lag() -> None:
    """A fit with ppo_clip and micro-batches of 4: the row holds the clip fraction the objective
    computes on the whole batch (naive log-probs), the token lag, and no acceptance rate."""
    policy = tiny_policy(seed=3)
    batch = make_batch(policy, rows=8, seed=5, max_version=2)
    objective_cfg = {"trust_region": "ppo_clip", "ppo_clip": {"eps_low": 0.05, "eps_high": 0.05}}
    objective = Objective.from_config(objective_cfg)
    with torch.no_grad():
        current = naive_logprobs(policy, batch)
    _, diag = objective(
        current, batch.behavior_log_probs, objective.advantages(batch.rewards), batch.action_mask
    )
    expected = float(diag["clip_fraction"])
    assert 0 < expected < 1
    module = learner_module(
        MODEL_CFG, objective_cfg, OPTIM_CFG, batch_size=8, micro_batch_size=4, policy=policy
    )
    module.policy_version = 3
    logger = MemoryLogger()
    trainer(1, logger=logger).fit(module, loader([batch]))
    ((_, row),) = logger.rows
    assert row["train/ppo_clip/clip_fraction"] == pytest.approx(expected, rel=1e-6)
    assert metrics.ACCEPTANCE not in row
    versions, mask = batch.token_versions, batch.action_mask
    token_lag = (3 - versions[mask].double()).mean()
    assert row[metrics.LAG_TOKEN_MEAN] == pytest.approx(float(token_lag), rel=1e-6)  # logged fp32
