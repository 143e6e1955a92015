"""Standalone worker for the DDP equivalence test (never collected by pytest).

`python ddp_worker.py OUT --devices 2 --micro 2` trains the tiny float64 policy for STEPS
updates with `Trainer(strategy="ddp", accelerator="cpu", devices=2)` (gloo); Lightning
re-launches this script for rank 1. Each rank serves its own contiguous rows of every global
batch. Every rank writes `OUT.rank{R}.pt` with its final parameters and, on rank 0, the logged
metrics. With `--devices 1` it runs the same training in one process.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import lightning as L  # noqa: E402
from learner_testlib import (  # noqa: E402
    MODEL_CFG,
    OBJECTIVE_CFG,
    OPTIM_CFG,
    MemoryLogger,
    loader,
    make_batch,
    snapshot,
    tiny_policy,
    trainer,
)

from frlab.learner import FlashReinforceModule  # noqa: E402

GLOBAL_B = 8
STEPS = 2


class RankRows(L.LightningDataModule):
    """Rows [r*B/W, (r+1)*B/W) of every global batch for rank r."""

    def __init__(self, batches) -> None:
        super().__init__()
        self.batches = batches

    def train_dataloader(self):
        world, rank = self.trainer.world_size, self.trainer.global_rank
        local = GLOBAL_B // world
        rows = slice(rank * local, (rank + 1) * local)
        return loader([b.select(rows) for b in self.batches])


def train(devices: int, micro: int) -> tuple[L.Trainer, FlashReinforceModule, MemoryLogger]:
    policy = tiny_policy(seed=0)
    batches = [make_batch(policy, rows=GLOBAL_B, seed=40 + s) for s in range(STEPS)]
    module = FlashReinforceModule(
        MODEL_CFG,
        OBJECTIVE_CFG,
        {**OPTIM_CFG, "scheduler": "cosine", "warmup_ratio": 0.5},
        batch_size=GLOBAL_B,
        micro_batch_size=micro,
        policy=policy,
    )
    logger = MemoryLogger()
    strategy = "ddp" if devices > 1 else "auto"
    fit_trainer = trainer(STEPS, devices=devices, strategy=strategy, logger=logger)
    fit_trainer.fit(module, datamodule=RankRows(batches))
    return fit_trainer, module, logger


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--micro", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    fit_trainer, module, logger = train(args.devices, args.micro)
    result = {
        "params": snapshot(module.policy),
        "policy_version": module.policy_version,
        "global_step": fit_trainer.global_step,
        "world_size": fit_trainer.world_size,
        "rows": [row for _, row in logger.rows],
    }
    torch.save(result, f"{args.out}.rank{fit_trainer.global_rank}.pt")


if __name__ == "__main__":
    main()
