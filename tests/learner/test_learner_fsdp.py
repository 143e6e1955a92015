"""A 2-process FSDP2 run (CPU, gloo) equals a 1-process run; sharded checkpoints resume.

The learner under `FSDP2Strategy` shards every decoder layer and the rest of the policy (the
`LogprobScorer` root, chunked LM head included); each rank scores 2 micro-batches per step.
Its gathered parameters and global metrics must equal those of the unsharded single-process
learner on the same global batches, a sharded checkpoint (a folder of shards) must resume to
exactly the parameters of an uninterrupted run, and Lightning's FSDP1 `FSDPStrategy` must be
refused with an error naming `trainer.strategy`.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from ddp_worker import STEPS
from fsdp_worker import fit
from learner_testlib import max_abs_diff, snapshot, tiny_policy

from frlab.learner import metrics as M
from frlab.learner.sharding import scorer_for

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fsdp_worker.py")


@pytest.mark.slow
def test_two_process_fsdp2_equals_one_process_and_resumes(tmp_path) -> None:
    out, ckpt = tmp_path / "fsdp", tmp_path / "last.ckpt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("MASTER_PORT", None)
    proc = subprocess.run(
        [sys.executable, WORKER, str(out), "--ckpt", str(ckpt)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rank0 = torch.load(f"{out}.rank0.pt", weights_only=False)
    rank1 = torch.load(f"{out}.rank1.pt", weights_only=False)
    assert rank0["world_size"] == 2 and rank0["policy_version"] == STEPS

    # Really sharded: every parameter is a DTensor and each rank holds about half of them.
    total = sum(p.numel() for p in tiny_policy().parameters())
    assert set(rank0["placements"].values()) == {"DTensor"}
    assert rank0["local_numel"] + rank1["local_numel"] == total
    assert rank0["local_numel"] < 0.6 * total

    _, single, single_rows = fit(STEPS, fsdp=False)
    single_params = snapshot(single.policy)
    assert max_abs_diff(single_params, snapshot(tiny_policy(seed=0))) > 1e-3  # it trained
    assert max_abs_diff(rank0["params"], rank1["params"]) == 0.0
    assert max_abs_diff(rank0["params"], single_params) < 1e-9
    for fsdp_row, one_row in zip(rank0["rows"], single_rows, strict=True):
        for key in (M.LOSS, M.GRAD_NORM, M.REWARD, M.ACCEPTANCE, M.SEQUENCE_KL, M.LAG_MAX):
            assert fsdp_row[key] == pytest.approx(one_row[key], rel=1e-9, abs=1e-12), key

    # The sharded checkpoint is a folder; resuming it continues exactly.
    assert ckpt.is_dir() and (ckpt / "meta.pt").is_file()
    assert rank0["resumed_version"] == STEPS + 1 and rank0["resumed_step"] == STEPS + 1
    _, uninterrupted, _ = fit(STEPS + 1, fsdp=False)
    assert max_abs_diff(rank0["resumed_params"], snapshot(uninterrupted.policy)) < 1e-9
    assert max_abs_diff(rank0["resumed_params"], rank0["params"]) > 1e-4


def test_lightning_fsdp1_strategy_is_refused_naming_the_field() -> None:
    from lightning.pytorch.strategies import FSDPStrategy

    with pytest.raises(ValueError, match=r"^trainer\.strategy: Lightning's FSDPStrategy"):
        scorer_for(FSDPStrategy(), tiny_policy())


def test_unsharded_strategies_keep_the_plain_policy() -> None:
    assert scorer_for(None, tiny_policy()) is None
    assert scorer_for("auto", tiny_policy()) is None
