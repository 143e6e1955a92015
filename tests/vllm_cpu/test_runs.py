"""`python -m frlab` runs on a real vLLM engine on this CPU (the in-process engine,
`rollout/engine=vllm`): the toy preset through vLLM, and a run whose engine core is killed
mid-run, which must stop with a clear error, exit 75 and keep its last step checkpointed."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch
from helpers.vllm_cpu import finish, metrics, start_run, summary, tail, vllm_processes, wait_for

pytestmark = pytest.mark.vllm_cpu

ENGINE_DOWN_EXIT = 75


def test_the_toy_preset_runs_through_vllm_with_the_engines_log_probs_matching(tmp_path: Path):
    run, log = tmp_path / "run", tmp_path / "run.log"
    proc = start_run(run, ["experiment=toy_cpu_vllm", "trainer.max_steps=20"], log)
    assert finish(proc, 600, log) == 0, tail(log)
    rows = metrics(run)
    assert [int(r["step"]) for r in rows] == list(range(1, 21))
    # the first batch was sampled by the very weights the learner holds: only kernels differ
    assert float(rows[0]["train/sequence_kl_mean"]) < 1e-6, rows[0]
    assert all(float(r["train/acceptance_rate"]) > 0.5 for r in rows)
    assert summary(run)["status"] == "finished"


def test_a_killed_engine_core_stops_the_run_with_exit_75_and_its_checkpoint(tmp_path: Path):
    run, log = tmp_path / "run", tmp_path / "run.log"
    overrides = [
        "experiment=toy_cpu_vllm",
        "trainer.max_steps=100000",
        "callbacks.model_checkpoint.every_n_train_steps=1000",
    ]
    proc = start_run(run, overrides, log)
    try:
        wait_for(lambda: len(metrics(run)) >= 5 or proc.poll() is not None, 600, "5 updates")
        assert proc.poll() is None, tail(log)
        cores = vllm_processes(proc.pid)
        assert cores, "no vLLM engine-core process under the run"
        killed_at = time.monotonic()
        for core in cores:
            os.kill(core.pid, signal.SIGKILL)
        code = finish(proc, 120, log)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    took = time.monotonic() - killed_at
    text = tail(log, 20000)
    assert code == ENGINE_DOWN_EXIT, text
    assert "the rollout engine is down" in text and "engine core" in text, text
    assert took < 90, took
    steps = len(metrics(run))
    assert (run / "checkpoints" / "last.ckpt").exists(), text
    assert summary(run)["status"] == "failed"
    assert f"step {steps}" in text or steps >= 5


def test_a_lora_run_through_vllm_serves_the_learners_adapter_from_the_first_batch(tmp_path: Path):
    """`model.lora` on `rollout/engine=vllm`, starting from a saved adapter far from zero: the
    first batch's sequence KL is ~0 only if vLLM samples from base + that adapter. In sync mode
    every later batch is sampled by the adapter the learner pushed just before it, so its KL
    stays ~0 too (async batches may be up to max_policy_lag versions old: a timing-dependent
    KL, which once passed 1e-4 after a few updates)."""
    import copy

    from helpers.vllm_cpu import save_model

    from frlab.model.lora import apply_lora

    base = save_model(tmp_path / "base", seed=0)
    policy = apply_lora(
        copy.deepcopy(base),
        {
            "rank": 8,
            "alpha": 16.0,
            "dropout": 0.0,
            "target_modules": ["all-linear"],
            "adapter": None,
        },
    )
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    policy.save_pretrained(tmp_path / "adapter")
    run, log = tmp_path / "run", tmp_path / "run.log"
    overrides = [
        "experiment=toy_cpu_vllm",
        "trainer.max_steps=12",
        "model.lora.rank=8",
        f"model.lora.adapter={tmp_path / 'adapter'}",
        "rollout.mode=sync",
    ]
    proc = start_run(run, overrides, log)
    assert finish(proc, 600, log) == 0, tail(log)
    rows = metrics(run)
    assert [int(r["step"]) for r in rows] == list(range(1, 13))
    assert float(rows[0]["train/sequence_kl_mean"]) < 1e-6, rows[0]
    assert all(float(r["train/policy_lag_max"]) == 0 for r in rows), rows
    assert all(float(r["train/sequence_kl_mean"]) < 1e-4 for r in rows), rows
    assert "Using PunicaWrapperCPU" in tail(log, 10**7)  # vLLM's LoRA path is the one serving
