"""A 2-process FSDP2 run (CPU, gloo) equals a 1-process run; sharded checkpoints resume.

The learner under `FSDP2Strategy` shards every decoder layer and the rest of the policy (the
`LogprobScorer` root, chunked LM head included); each rank scores packed token-budget
micro-batches (the single process: padded micro-batches of 2 rows), and with
`optim.skip_zero_signal_steps` on one batch skips its forward and backward and one its backward
(forwards without backward under FSDP2).
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
from ddp_worker import STEPS, ZERO_SIGNAL_STEPS
from fsdp_worker import fit, moe_policy
from helpers.learner_setup import max_abs_diff, snapshot, tiny_policy

from frlab.learner import metrics as M
from frlab.learner.sharding import scorer_for

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fsdp_worker.py")


def _launch(out, *args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("MASTER_PORT", None)
    proc = subprocess.run(
        [sys.executable, WORKER, str(out), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.slow
def test_two_process_fsdp2_equals_one_process_and_resumes(tmp_path) -> None:
    out, ckpt = tmp_path / "fsdp", tmp_path / "last.ckpt"
    _launch(out, "--ckpt", str(ckpt))
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
    for step, (fsdp_row, one_row) in enumerate(zip(rank0["rows"], single_rows, strict=True)):
        # Logged values pass through Lightning's float32 logging: 1e-6 (parameters: 1e-9).
        for key in (M.LOSS, M.GRAD_NORM, M.REWARD, M.ACCEPTANCE, M.SEQUENCE_KL, M.LAG_MAX):
            assert fsdp_row[key] == pytest.approx(one_row[key], rel=1e-6, abs=1e-12, nan_ok=True)
        assert fsdp_row[M.ZERO_SIGNAL] == float(step in ZERO_SIGNAL_STEPS)

    # The sharded checkpoint: a symlink to one hidden folder of shards (the first save's folder
    # is gone after the second save); resuming it continues exactly.
    target = rank0["ckpt_target"]
    assert target is not None and target.startswith(".last.ckpt.")
    assert rank0["ckpt_entries"] == sorted([target, "last.ckpt"])
    assert sorted(p.name for p in ckpt.iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "meta.pt",
    ]
    assert rank0["resumed_version"] == STEPS + 1 and rank0["resumed_step"] == STEPS + 1
    _, uninterrupted, _ = fit(STEPS + 1, fsdp=False)
    assert max_abs_diff(rank0["resumed_params"], snapshot(uninterrupted.policy)) < 1e-9
    assert max_abs_diff(rank0["resumed_params"], rank0["params"]) > 1e-4

    # `python -m frlab.export` reads the shards in one process: the gathered weights, exactly.
    from safetensors.torch import load_file

    from frlab.export import export

    exported = load_file(export(ckpt, tmp_path / "hf", dtype="float64") / "model.safetensors")
    assert sorted(exported) == sorted(rank0["params"])
    assert all(torch.equal(exported[k], rank0["params"][k]) for k in exported)


def test_lightning_fsdp1_strategy_is_refused_naming_the_field() -> None:
    from lightning.pytorch.strategies import FSDPStrategy

    with pytest.raises(ValueError, match=r"trainer\.strategy`: Lightning's FSDPStrategy"):
        scorer_for(FSDPStrategy(), tiny_policy())


def test_unsharded_strategies_keep_the_plain_policy() -> None:
    assert scorer_for(None, tiny_policy()) is None
    assert scorer_for("auto", tiny_policy()) is None


@pytest.mark.slow
def test_two_process_fsdp2_moe_with_gradient_checkpointing_equals_one_process(tmp_path) -> None:
    """Qwen3-MoE decoder layers as FSDP2 units, recomputed in backward (float64, so the
    tolerance is float64 rounding, as in the dense test, not a float32 figure tuned on one
    machine)."""
    out = tmp_path / "moe"
    _launch(out, "--moe")
    rank0 = torch.load(f"{out}.rank0.pt", weights_only=False)
    assert rank0["policy_version"] == STEPS and set(rank0["placements"].values()) == {"DTensor"}
    _, single, single_rows = fit(STEPS, fsdp=False, moe=True)
    single_params = snapshot(single.policy)
    assert max_abs_diff(single_params, snapshot(moe_policy())) > 1e-3  # it trained
    assert max_abs_diff(rank0["params"], single_params) < 1e-9
    for fsdp_row, one_row in zip(rank0["rows"], single_rows, strict=True):
        for key in (M.LOSS, M.GRAD_NORM, M.ACCEPTANCE):
            assert fsdp_row[key] == pytest.approx(one_row[key], rel=1e-6, abs=1e-12, nan_ok=True)


@pytest.mark.slow
def test_two_process_fsdp2_moe_lora_equals_one_process(tmp_path) -> None:
    """LoRA on Qwen3-MoE (attention projections and fused expert weights adapted, the router
    never) under FSDP2 with activation checkpointing: the adapters one process trains, the
    base and the router unchanged."""
    out = tmp_path / "moe_lora"
    _launch(out, "--moe", "--lora")
    rank0 = torch.load(f"{out}.rank0.pt", weights_only=False)
    assert rank0["policy_version"] == STEPS and set(rank0["placements"].values()) == {"DTensor"}
    _, single, _ = fit(STEPS, fsdp=False, moe=True, lora=True)
    single_params = snapshot(single.policy)
    assert max_abs_diff(rank0["params"], single_params) < 1e-9
    adapters = [k for k in single_params if "lora_" in k]
    assert any("experts" in k for k in adapters) and not any("mlp.gate." in k for k in adapters)
    assert max(float(single_params[k].abs().max()) for k in adapters if "lora_B" in k) > 1e-4
    base = {
        k.replace(".base_layer", "").removeprefix("base_model.model."): v
        for k, v in single_params.items()
        if "lora_" not in k
    }
    assert max_abs_diff(base, snapshot(moe_policy())) == 0.0  # the base never trains


@pytest.mark.slow
def test_toy_run_under_fsdp2_on_cpu_syncs_weights_and_resumes_last(tmp_path) -> None:
    """`python -m frlab trainer=fsdp` on 2 CPU ranks (gloo): the engine gets gathered weights
    every step (WeightSyncCallback), `last.ckpt` is a published sharded folder, and
    `ckpt_path=last` continues the run."""
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("MASTER_PORT", None)
    base = [
        sys.executable,
        "-m",
        "frlab",
        "trainer=fsdp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.precision=32-true",
        "data.micro_batch_size=16",
        "callbacks.model_checkpoint.every_n_train_steps=1",
        f"hydra.run.dir={run}",
        "plots=false",
    ]
    for steps, ckpt in ((2, "null"), (3, "last")):
        proc = subprocess.run(
            [*base, f"trainer.max_steps={steps}", f"ckpt_path={ckpt}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
    last = run / "checkpoints" / "last.ckpt"
    assert last.is_symlink() and (last / "meta.pt").is_file()
    meta = torch.load(last / "meta.pt", weights_only=False)
    assert meta["global_step"] == 3 and meta["policy_version"] == 3
    steps = [
        int(float(line.split(",")[header.index("step")]))
        for header in [(run / "metrics.csv").read_text().splitlines()[0].split(",")]
        for line in (run / "metrics.csv").read_text().splitlines()[1:]
    ]
    assert steps == [1, 2, 3]
