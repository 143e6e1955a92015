"""Standalone worker for the FSDP2 equivalence test (never collected by pytest).

`python fsdp_worker.py OUT` trains the tiny float64 policy for STEPS updates with
`Trainer(strategy=FSDP2Strategy(), accelerator="cpu", devices=2)` (gloo): every decoder layer
and the LogprobScorer root are FSDP2 units; each rank packs its rows into micro-batches of at
most BUDGET tokens (the ranks agree on one count: FSDP2 gathers parameters in every forward).
The global batches and `optim.skip_zero_signal_steps` are the DDP worker's: one batch skips
forward and backward, one runs forwards without backward. Lightning re-launches this script
for rank 1. Each rank writes `OUT.rank{R}.pt` with the GATHERED final parameters,
the metric rows and the parameter placements; with `--ckpt` it then saves a sharded
checkpoint twice there (a symlink to a hidden folder of shards) and, in a second fit, resumes
from it for one more step. `--moe` trains a tiny float32 Qwen3-MoE with gradient
checkpointing instead (activation recomputation inside FSDP2 units), in float64 too: its experts
run the eager per-expert loop (`grouped_mm` has no float64 kernel), so both runs are exact up
to float64 rounding by construction. `--lora` trains LoRA adapters only (with `--moe`: on the
attention projections and the experts' fused weights).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: helpers

from ddp_worker import GLOBAL_B, OPTIM, STEPS, RankRows, global_batches  # noqa: E402
from helpers.learner import learner_module  # noqa: E402
from helpers.learner_setup import (  # noqa: E402
    MODEL_CFG,
    OBJECTIVE_CFG,
    VOCAB,
    MemoryLogger,
    tiny_policy,
    trainer,
)
from helpers.models import policy_of  # noqa: E402

from frlab.learner import FlashReinforceModule  # noqa: E402
from frlab.learner.sharding import FSDP2Strategy, full_state_dict  # noqa: E402
from frlab.model.policy import tiny_config  # noqa: E402


def moe_policy() -> torch.nn.Module:
    """A tiny float64 Qwen3-MoE with gradient checkpointing on; eager experts (the default
    `grouped_mm` kernel has no float64)."""
    config = tiny_config("qwen3_moe", vocab_size=VOCAB)
    config._experts_implementation = "eager"
    policy = policy_of(config=config, seed=0, gradient_checkpointing=True)
    return policy.to(torch.float64).train()


BUDGET = 30  # packed tokens per micro-batch on a rank (rows have 3 to 16 tokens)


def module(
    moe: bool = False, fsdp: bool = True, lora: bool = False
) -> tuple[FlashReinforceModule, list]:
    """A fresh learner (LR horizon STEPS + 1) and its STEPS + 1 global batches: packed
    token-budget micro-batches under FSDP2, padded micro-batches of 2 rows otherwise;
    `lora`: LoRA adapters on every linear layer and MoE expert weights, only they train."""
    policy = moe_policy() if moe else tiny_policy(seed=0)
    batches = global_batches(policy, STEPS + 1)
    if lora:
        from ddp_worker import LORA

        from frlab.model.lora import apply_lora

        torch.manual_seed(1)  # peft draws A at random: the same adapters in every process
        policy = apply_lora(policy, LORA).to(torch.float64)
    layout = (
        {"micro_batch_size": GLOBAL_B, "max_tokens_per_micro_batch": BUDGET}
        if fsdp
        else {"micro_batch_size": 2, "pack_sequences": False}
    )
    learner = learner_module(
        MODEL_CFG,
        OBJECTIVE_CFG,
        OPTIM,
        batch_size=GLOBAL_B,
        max_steps=STEPS + 1,
        policy=policy,
        **layout,
    )
    return learner, batches


def fit(
    steps: int,
    first: int = 0,
    ckpt: str | None = None,
    fsdp: bool = True,
    moe: bool = False,
    lora: bool = False,
):
    """Fit `steps` - `first` updates on batches[first:steps] (resuming from `ckpt`)."""
    learner, batches = module(moe, fsdp, lora)
    logger = MemoryLogger()
    devices, strategy = (2, FSDP2Strategy()) if fsdp else (1, "auto")
    trained = trainer(steps, devices=devices, strategy=strategy, logger=logger)
    trained.fit(learner, datamodule=RankRows(batches[first:steps]), ckpt_path=ckpt)
    return trained, learner, [row for _, row in logger.rows]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--ckpt", default=None)
    parser.add_argument("--moe", action="store_true")
    parser.add_argument("--lora", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    trained, learner, rows = fit(STEPS, moe=args.moe, lora=args.lora)
    placements = {n: type(p).__name__ for n, p in learner.policy.named_parameters()}
    local = sum(p.to_local().numel() for p in learner.policy.parameters())
    result = {
        "params": full_state_dict(learner.policy),
        "placements": placements,
        "local_numel": local,
        "world_size": trained.world_size,
        "policy_version": learner.policy_version,
        "rows": rows,
    }
    if args.ckpt is None:
        torch.save(result, f"{args.out}.rank{trained.global_rank}.pt")
        return
    trained.save_checkpoint(args.ckpt)
    trained.save_checkpoint(args.ckpt)  # replaces the first one (atomically, via the symlink)
    folder = os.path.dirname(args.ckpt)
    result["ckpt_entries"] = sorted(os.listdir(folder))
    result["ckpt_target"] = os.readlink(args.ckpt) if os.path.islink(args.ckpt) else None
    again, resumed, _ = fit(STEPS + 1, first=STEPS, ckpt=args.ckpt)
    result["resumed_version"] = resumed.policy_version
    result["resumed_step"] = again.global_step
    result["resumed_params"] = full_state_dict(resumed.policy)
    torch.save(result, f"{args.out}.rank{trained.global_rank}.pt")


if __name__ == "__main__":
    main()
