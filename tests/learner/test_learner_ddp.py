"""A 2-process DDP run (CPU, gloo) equals a 1-process run on the same global batches.

Rewards are centred over the global batch (all-gathered), losses are normalised by the global B
and policy-token count, each rank back-propagates W * loss so DDP's gradient average is the
full-batch gradient. The DDP ranks pack their rows into token-budget micro-batches (their own
plans differ in count, so the ranks agree on the larger); the single process runs padded
micro-batches of 3 rows. With `optim.skip_zero_signal_steps` on, the batch with equal rewards
skips its forward and backward on both ranks, the all-rejected batch skips its backward, and
neither moves the weights. The worker is a standalone script in a subprocess, so Lightning
re-launches that script, never pytest.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from ddp_worker import STEPS, ZERO_SIGNAL_STEPS, train
from helpers.learner_setup import max_abs_diff, snapshot, tiny_policy

from frlab.learner import metrics as M

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_worker.py")


@pytest.mark.slow
def test_two_process_ddp_equals_one_process(tmp_path) -> None:
    out = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("MASTER_PORT", None)
    proc = subprocess.run(
        [sys.executable, WORKER, str(out), "--devices", "2", "--budget", "30"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rank0 = torch.load(f"{out}.rank0.pt", weights_only=True)
    rank1 = torch.load(f"{out}.rank1.pt", weights_only=True)
    assert rank0["world_size"] == 2 and rank0["global_step"] == STEPS

    # Packing really ran with unequal per-rank plans on some step, equalised to one count.
    assert any(a != b for a, b in zip(rank0["plan_sizes"], rank1["plan_sizes"], strict=True))
    single_trainer, single, logger, _ = train(devices=1, micro=3, budget=None, pack=False)
    single_rows = [row for _, row in logger.rows]
    assert single_trainer.world_size == 1 and single.policy_version == STEPS

    single_params = snapshot(single.policy)
    assert max_abs_diff(single_params, snapshot(tiny_policy(seed=0))) > 1e-3
    assert max_abs_diff(rank0["params"], rank1["params"]) == 0.0  # replicas stay in sync
    assert max_abs_diff(rank0["params"], single_params) < 1e-6
    assert rank0["policy_version"] == STEPS
    assert len(rank0["rows"]) == STEPS
    for step, (ddp_row, one_row) in enumerate(zip(rank0["rows"], single_rows, strict=True)):
        # Global statistics, not rank 0's half: identical to the single-process values.
        for key in (M.LOSS, M.GRAD_NORM, M.REWARD, M.ACCEPTANCE, M.SEQUENCE_KL, M.LAG_MAX):
            assert ddp_row[key] == pytest.approx(one_row[key], rel=1e-6, abs=1e-12, nan_ok=True)
        assert ddp_row[M.ZERO_SIGNAL] == float(step in ZERO_SIGNAL_STEPS)
        assert ddp_row[M.MICRO_BATCHES] == max(
            rank0["plan_sizes"][step], rank1["plan_sizes"][step]
        ) * (step != 1)


@pytest.mark.slow
def test_two_process_ddp_lora_with_checkpointing_and_packing_equals_one_process(tmp_path) -> None:
    """LoRA under DDP, packed rows and activation checkpointing: the same adapters as one
    padded process without checkpointing, and the base weights never move."""
    out = tmp_path / "ddp_lora"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("MASTER_PORT", None)
    cmd = [
        sys.executable,
        WORKER,
        str(out),
        "--devices",
        "2",
        "--budget",
        "30",
        "--lora",
        "--checkpointing",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rank0 = torch.load(f"{out}.rank0.pt", weights_only=True)
    rank1 = torch.load(f"{out}.rank1.pt", weights_only=True)
    _, single, _, _ = train(devices=1, micro=3, budget=None, pack=False, lora=True)
    params = snapshot(single.policy)
    adapters = {k for k in params if "lora_" in k}
    base = {k: v for k, v in params.items() if k not in adapters}
    assert adapters and max_abs_diff(rank0["params"], rank1["params"]) == 0.0
    assert max_abs_diff(rank0["params"], params) < 1e-6
    start = {
        k.replace(".base_layer", "").removeprefix("base_model.model."): v for k, v in base.items()
    }
    assert max_abs_diff(start, snapshot(tiny_policy(seed=0))) == 0.0  # the base never trains
    moved = max(float((params[k] - 0).abs().max()) for k in adapters if "lora_B" in k)
    assert moved > 1e-4  # B starts at zero: the adapters did train
