"""Every objective preset keeps the learner's micro-batch invariance (global normalisers).

`token_mean` and `constant_length` aggregations and group baselines (GRPO, Dr. GRPO, RLOO)
normalise by global quantities or need whole groups; splitting the batch into micro-batches
must not change the update, the loss or the gradient norm for any of them.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.learner import learner_module
from helpers.learner_setup import (
    MODEL_CFG,
    OPTIM_CFG,
    MemoryLogger,
    loader,
    make_batch,
    max_abs_diff,
    snapshot,
    tiny_policy,
    trainer,
)

from frlab.learner import metrics as M
from frlab.objective import PRESETS

B = 8


def _grouped_batch(policy: torch.nn.Module):
    """Pairs of rows share a prompt id (groups of 2 for group baselines), mixed rewards."""
    batch = make_batch(policy, rows=B, seed=50)
    batch.prompt_ids = torch.arange(B) // 2
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    return batch


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_update_is_micro_batch_invariant(preset: str) -> None:
    base = tiny_policy(seed=21)
    batch = _grouped_batch(base)
    objective = {**PRESETS[preset], "constant_length": {"length": 12}}
    outcomes = []
    for micro in (B, 2):
        module = learner_module(
            MODEL_CFG,
            objective,
            OPTIM_CFG,
            batch_size=B,
            micro_batch_size=micro,
            policy=copy.deepcopy(base),
        )
        logger = MemoryLogger()
        trainer(1, logger=logger).fit(module, loader([batch]))
        outcomes.append((snapshot(module.policy), logger.rows[-1][1]))
    (full_params, full_row), (split_params, split_row) = outcomes
    assert max_abs_diff(full_params, snapshot(base)) > 1e-3
    assert max_abs_diff(full_params, split_params) < 1e-6
    assert {M.LOSS, M.GRAD_NORM, M.RETAINED_FRAC} <= set(full_row)
    assert (M.ACCEPTANCE in full_row) == (
        PRESETS[preset]["trust_region"] == "sequence_bernoulli_kl"
    )
    train = sorted(k for k in full_row if k.startswith("train/") and k != M.MICRO_BATCHES)
    assert (full_row[M.MICRO_BATCHES], split_row[M.MICRO_BATCHES]) == (1.0, B / 2)
    assert train == sorted(k for k in split_row if k.startswith("train/") and k != M.MICRO_BATCHES)
    for key in train:
        assert split_row[key] == pytest.approx(full_row[key], rel=1e-6, abs=1e-12), key
