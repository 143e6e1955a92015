"""`optim.schedule_steps`: the lr schedule spans the reference run's updates, whatever step the
run stops at (a paper preset stops at a headline step of a longer schedule)."""

from __future__ import annotations

import math

import pytest
from helpers.learner import learner_module
from helpers.learner_setup import (
    MODEL_CFG,
    OBJECTIVE_CFG,
    OPTIM_CFG,
    MemoryLogger,
    loader,
    make_batch,
    tiny_policy,
    trainer,
)

from frlab.learner import metrics as M


def _cosine(step: int, horizon: int, warmup: float, floor: float) -> float:
    """The schedule of frlab.learner.optim, written out: linear warm-up, cosine to `floor`."""
    w = round(warmup * horizon)
    if step < w:
        return (step + 1) / w
    progress = min(1.0, (step - w) / max(1, horizon - w - 1))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


@pytest.mark.parametrize("schedule_steps", [None, 40])
def test_lr_follows_the_schedule_length_not_the_stop_step(schedule_steps: int | None) -> None:
    policy = tiny_policy(seed=4)
    batches = [make_batch(policy, rows=4, seed=s) for s in (1, 2, 3)]
    optim = {
        **OPTIM_CFG,
        "scheduler": "cosine",
        "warmup_ratio": 0.05,
        "min_lr_ratio": 0.1,
        "schedule_steps": schedule_steps,
    }
    module = learner_module(
        MODEL_CFG,
        OBJECTIVE_CFG,
        optim,
        batch_size=4,
        micro_batch_size=4,
        max_steps=len(batches),
        policy=policy,
    )
    logger = MemoryLogger()
    trainer(len(batches), logger=logger).fit(module, loader(batches))
    horizon = schedule_steps or len(batches)  # null: the schedule spans trainer.max_steps
    lrs = [row[M.LR] for _, row in logger.rows]
    expected = [OPTIM_CFG["lr"] * _cosine(s, horizon, 0.05, 0.1) for s in range(3)]
    assert lrs == pytest.approx(expected, rel=1e-6)  # logged as float32
    if schedule_steps:  # 2 warm-up updates of 40, then the start of a 38-update cosine
        assert lrs == pytest.approx(
            [OPTIM_CFG["lr"] * f for f in (0.5, 1.0, 1.0)], rel=1e-6
        )  # logged as float32
