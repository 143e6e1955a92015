"""Standalone worker for the DDP equivalence test (never collected by pytest).

`python ddp_worker.py OUT --devices 2 --budget 30` trains the tiny float64 policy for STEPS
updates with `Trainer(strategy="ddp", accelerator="cpu", devices=2)` (gloo); Lightning
re-launches this script for rank 1. Each rank serves its own contiguous rows of every global
batch, as packed micro-batches of at most `--budget` tokens (`--micro N --padded`: padded
micro-batches of N rows instead). `optim.skip_zero_signal_steps` is on and the global batches
include one whose rewards are all equal and one whose every row the trust region rejects
(`global_batches`). Every rank writes `OUT.rank{R}.pt` with its final parameters, its own
micro-batch plan sizes and, on rank 0, the logged metrics. With `--devices 1` it runs the same
training in one process. `--lora` trains LoRA adapters only, `--checkpointing` turns on
activation checkpointing.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: helpers

import lightning as L  # noqa: E402
from helpers.learner import learner_module  # noqa: E402
from helpers.learner_setup import (  # noqa: E402
    MODEL_CFG,
    OBJECTIVE_CFG,
    OPTIM_CFG,
    MemoryLogger,
    flat_rewards,
    loader,
    make_batch,
    rejected,
    snapshot,
    tiny_policy,
    trainer,
)

from frlab.learner import FlashReinforceModule  # noqa: E402
from frlab.learner.micro_batches import micro_batch_plan  # noqa: E402

GLOBAL_B = 8
STEPS = 4
ZERO_SIGNAL_STEPS = (1, 2)  # indices of the all-equal-rewards and the all-rejected batch
# Cosine to 10% of the peak: the last update still moves the weights.
OPTIM = {
    **OPTIM_CFG,
    "scheduler": "cosine",
    "warmup_ratio": 0.5,
    "min_lr_ratio": 0.1,
    "skip_zero_signal_steps": True,
}


def global_batches(policy: torch.nn.Module, count: int) -> list:
    """`count` global batches; batch 1 has equal rewards, batch 2 only rejected rows."""
    batches = [make_batch(policy, rows=GLOBAL_B, seed=40 + s) for s in range(count)]
    batches[1] = flat_rewards(batches[1])
    batches[2] = rejected(batches[2])
    return batches


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


LORA = {"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["all-linear"], "adapter": None}


def train(
    devices: int,
    micro: int,
    budget: int | None,
    pack: bool,
    lora: bool = False,
    checkpointing: bool = False,
) -> tuple[L.Trainer, FlashReinforceModule, MemoryLogger, list]:
    """`lora`: the policy with LoRA adapters on every linear layer (only they train);
    `checkpointing`: non-reentrant activation checkpointing, as `model.gradient_checkpointing`."""
    policy = tiny_policy(seed=0)
    batches = global_batches(policy, STEPS)
    if checkpointing:
        from frlab.model.policy import enable_checkpointing

        policy.config.use_cache = False
        enable_checkpointing(policy)
    if lora:
        from frlab.model.lora import apply_lora

        torch.manual_seed(1)  # peft draws A at random: the same adapters in every process
        policy = apply_lora(policy, LORA)
    module = learner_module(
        MODEL_CFG,
        OBJECTIVE_CFG,
        OPTIM,
        batch_size=GLOBAL_B,
        micro_batch_size=micro,
        max_tokens_per_micro_batch=budget,
        pack_sequences=pack,
        policy=policy,
    )
    logger = MemoryLogger()
    strategy = "ddp" if devices > 1 else "auto"
    fit_trainer = trainer(STEPS, devices=devices, strategy=strategy, logger=logger)
    data = RankRows(batches)
    fit_trainer.fit(module, datamodule=data)
    return fit_trainer, module, logger, local_plan_sizes(fit_trainer, module, batches)


def local_plan_sizes(fit_trainer: L.Trainer, module: FlashReinforceModule, batches) -> list:
    """This rank's own micro-batch count per batch before ranks agree on one."""
    world, rank = fit_trainer.world_size, fit_trainer.global_rank
    local = GLOBAL_B // world
    rows = slice(rank * local, (rank + 1) * local)
    return [len(micro_batch_plan(b.select(rows), module.micro)) for b in batches]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--micro", type=int, default=GLOBAL_B)
    parser.add_argument("--budget", type=int, default=None)
    parser.add_argument("--padded", action="store_true")
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--checkpointing", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    fit_trainer, module, logger, plans = train(
        args.devices, args.micro, args.budget, not args.padded, args.lora, args.checkpointing
    )
    result = {
        "plan_sizes": plans,
        "params": snapshot(module.policy),
        "policy_version": module.policy_version,
        "global_step": fit_trainer.global_step,
        "world_size": fit_trainer.world_size,
        "rows": [row for _, row in logger.rows],
    }
    torch.save(result, f"{args.out}.rank{fit_trainer.global_rank}.pt")


if __name__ == "__main__":
    main()
