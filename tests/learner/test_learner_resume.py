"""`ckpt_path=last` resumes: N steps, save, resume for M more equals an uninterrupted N+M run."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.learner import learner_module
from helpers.learner_setup import (
    MODEL_CFG,
    OBJECTIVE_CFG,
    OPTIM_CFG,
    CursorDataModule,
    MemoryLogger,
    make_batch,
    max_abs_diff,
    snapshot,
    tiny_policy,
    trainer,
)
from lightning.pytorch.callbacks import ModelCheckpoint

from frlab.learner import AtomicCheckpointIO, FlashReinforceModule
from frlab.learner import metrics as M

B, N, TOTAL = 4, 3, 5
OPTIM = {**OPTIM_CFG, "scheduler": "cosine", "warmup_ratio": 0.2, "min_lr_ratio": 0.1}


def _module(policy: torch.nn.Module) -> FlashReinforceModule:
    # max_steps fixes the schedule horizon: the interrupted run stops early but keeps the same
    # cosine curve.
    return learner_module(
        MODEL_CFG,
        OBJECTIVE_CFG,
        OPTIM,
        batch_size=B,
        micro_batch_size=2,
        max_steps=TOTAL,
        policy=policy,
    )


def _checkpointing_trainer(max_steps: int, folder, logger: MemoryLogger):
    saver = ModelCheckpoint(dirpath=folder, save_top_k=0, save_last=True, every_n_train_steps=1)
    return trainer(
        max_steps,
        logger=logger,
        callbacks=[saver],
        enable_checkpointing=True,
        plugins=[AtomicCheckpointIO()],
    )


@pytest.mark.slow
def test_resume_from_last_continues_steps_version_and_parameters(tmp_path) -> None:
    base = tiny_policy(seed=20)
    batches = [make_batch(base, rows=B, seed=30 + s) for s in range(TOTAL)]

    straight = _module(copy.deepcopy(base))
    straight_log = MemoryLogger()
    trainer(TOTAL, logger=straight_log).fit(straight, datamodule=CursorDataModule(batches))

    first = _module(copy.deepcopy(base))
    first_trainer = _checkpointing_trainer(N, tmp_path, MemoryLogger())
    first_trainer.fit(first, datamodule=CursorDataModule(batches))
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert saved["global_step"] == N and saved["policy_version"] == N
    assert {"rng_states", "optimizer_states", "lr_schedulers", "CursorDataModule"} <= set(saved)

    # A differently initialised policy: everything must come from the checkpoint.
    resumed = _module(tiny_policy(seed=99))
    resumed_log = MemoryLogger()
    resumed_trainer = _checkpointing_trainer(TOTAL, tmp_path, resumed_log)
    resumed_trainer.fit(resumed, datamodule=CursorDataModule(batches), ckpt_path="last")

    assert resumed_trainer.global_step == TOTAL
    assert resumed.policy_version == TOTAL
    assert [step for step, _ in resumed_log.rows] == list(range(N, TOTAL))
    assert max_abs_diff(snapshot(resumed.policy), snapshot(straight.policy)) < 1e-9
    for (_, got), (_, want) in zip(resumed_log.rows, straight_log.rows[N:], strict=True):
        assert got[M.LR] == pytest.approx(want[M.LR], rel=1e-12)
        assert got[M.REWARD] == pytest.approx(want[M.REWARD])
        assert got[M.GRAD_NORM] == pytest.approx(want[M.GRAD_NORM], rel=1e-9)


def _lora_policy(seed: int) -> torch.nn.Module:
    from frlab.model.lora import apply_lora

    return apply_lora(
        tiny_policy(seed=seed),
        {
            "rank": 4,
            "alpha": 8.0,
            "dropout": 0.0,
            "target_modules": ["all-linear"],
            "adapter": None,
        },
    )


@pytest.mark.slow
def test_a_lora_run_resumes_exactly_with_only_its_adapters_trained(tmp_path) -> None:
    """LoRA (frlab.model.lora): the optimizer holds the adapters only; the checkpoint holds the
    adapters and their optimizer state, so a resume continues exactly; the base never moves."""
    from frlab.model.lora import is_adapter

    base = _lora_policy(seed=20)
    batches = [make_batch(base, rows=B, seed=30 + s) for s in range(TOTAL)]
    straight = _module(copy.deepcopy(base))
    trainer(TOTAL, logger=MemoryLogger()).fit(straight, datamodule=CursorDataModule(batches))
    moved = {
        n
        for n, p in straight.policy.named_parameters()
        if not torch.equal(p.detach(), dict(base.named_parameters())[n].detach())
    }
    assert moved and all(is_adapter(n) for n in moved)  # the base weights are frozen

    first = _module(copy.deepcopy(base))
    _checkpointing_trainer(N, tmp_path, MemoryLogger()).fit(
        first, datamodule=CursorDataModule(batches)
    )
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    (group,) = saved["optimizer_states"][0]["param_groups"]
    assert len(group["params"]) == sum(p.requires_grad for p in base.parameters())
    resumed = _module(_lora_policy(seed=99))
    _checkpointing_trainer(TOTAL, tmp_path, MemoryLogger()).fit(
        resumed, datamodule=CursorDataModule(batches), ckpt_path="last"
    )
    assert max_abs_diff(snapshot(resumed.policy), snapshot(straight.policy)) < 1e-9
