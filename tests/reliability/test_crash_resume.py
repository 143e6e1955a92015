"""kill -9 at several points, then resume: no step lost or repeated, counters over the whole run;
a resume of a finished run changes nothing; a damaged checkpoint fails before anything is
touched and names the intact one; a new run in a used folder is refused.

All runs are synchronous (`rollout.mode=sync`, collect then train), so the data a step trains
on does not depend on timing: the same prompts reach the same step in every run.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest
import torch
from helpers.reliability import (
    B,
    Running,
    ckpt_step,
    file_bytes,
    policy_params,
    run,
    steps,
    summary,
)

pytestmark = pytest.mark.slow

STEPS, EVERY = 12, 3
SYNC = (
    "rollout.mode=sync",
    f"trainer.max_steps={STEPS}",
    f"callbacks.model_checkpoint.every_n_train_steps={EVERY}",
    "+callbacks.samples._target_=frlab.tracking.samples.TrajectorySamples",
    "+callbacks.samples.path=${paths.output_dir}/samples.jsonl",
    f"+callbacks.samples.rows={B}",
)  # every trajectory of every step
RUN_FILES = ("metrics.csv", "summary.json", "checkpoints/last.ckpt")


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted synchronous run of STEPS steps."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    out = run(run_dir, *SYNC)
    assert out.returncode == 0, out.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """The same run killed with SIGKILL twice (past the first checkpoint, then between two
    later ones) and resumed each time; returns its folder and the steps written at the first
    kill. A write killed midway leaves a temp file next to the intact checkpoint: one is
    planted before the first resume, which must remove it."""
    run_dir = tmp_path_factory.mktemp("killed") / "run"
    first = Running(run_dir, *SYNC)
    first.wait_for_step(EVERY + 1)
    first.kill()
    at_kill = steps(run_dir)
    leftover = run_dir / "checkpoints" / ".last.ckpt.killed01.tmp"
    leftover.write_bytes(b"half a checkpoint")

    second = Running(run_dir, *SYNC, "ckpt_path=last")
    second.wait_for_step(2 * EVERY + 2)
    second.kill()
    assert not leftover.exists()

    out = run(run_dir, *SYNC, "ckpt_path=last")
    assert out.returncode == 0, out.stderr[-3000:]
    return run_dir, at_kill


def test_kill_9_at_several_points_then_resume_loses_and_repeats_no_step(
    killed: tuple[Path, list[int]], straight: Path
) -> None:
    run_dir, at_kill = killed
    assert at_kill and at_kill == list(range(1, len(at_kill) + 1))
    assert steps(run_dir) == list(range(1, STEPS + 1))  # every step once
    final = summary(run_dir)
    assert final["status"] == "finished" and final["steps"] == STEPS == final["rows"]
    # Counters restored with each checkpoint: the run's totals, not the last segment's.
    assert final["rollout_stats"]["consumed"] == STEPS * B
    assert final["rollout_stats"]["batches"] == STEPS
    assert ckpt_step(run_dir / "checkpoints" / "last.ckpt") == STEPS
    # samples.jsonl: every step once, on the same prompts as the uninterrupted run
    assert _prompts_per_step(run_dir) == _prompts_per_step(straight)
    assert sorted(_prompts_per_step(run_dir)) == list(range(1, STEPS + 1))


def test_killed_and_resumed_sync_run_ends_with_the_uninterrupted_parameters(
    killed: tuple[Path, list[int]], straight: Path
) -> None:
    ours = policy_params(killed[0] / "checkpoints" / "last.ckpt")
    reference = policy_params(straight / "checkpoints" / "last.ckpt")
    assert ours.keys() == reference.keys()
    assert all(torch.equal(ours[k], reference[k]) for k in ours)


def _prompts_per_step(run_dir: Path) -> dict[int, list[list[int]]]:
    """step -> the sorted prompt token ids of its batch (samples.jsonl holds every row)."""
    per_step: dict[int, list[list[int]]] = {}
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        record = json.loads(line)
        per_step.setdefault(record["step"], []).append(record["prompt_ids"])
    return {step: sorted(prompts) for step, prompts in per_step.items()}


HYDRA_RECORD = (".hydra/config.yaml", ".hydra/overrides.yaml")


def test_resume_of_a_finished_run_says_so_and_changes_nothing(straight: Path) -> None:
    before = file_bytes(straight, *RUN_FILES)
    record = file_bytes(straight, *HYDRA_RECORD)
    kept_before = set((straight / ".hydra" / "previous").glob("*"))
    out = run(straight, *SYNC, "ckpt_path=last")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "already finished" in out.stdout + out.stderr
    assert file_bytes(straight, *RUN_FILES) == before
    # Hydra records the resume's launch; the earlier record is kept, not replaced
    (kept,) = set((straight / ".hydra" / "previous").glob("*")) - kept_before
    assert list(file_bytes(kept, "config.yaml", "overrides.yaml").values()) == list(record.values())


def test_a_new_run_in_a_used_folder_is_refused_and_changes_nothing(straight: Path) -> None:
    before = file_bytes(straight, *RUN_FILES, *HYDRA_RECORD)
    out = run(straight, *SYNC, "seed=7")  # other overrides: Hydra would record them
    assert out.returncode == 2, out.stderr[-3000:]
    assert "config key `paths.output_dir`" in out.stderr
    assert "ckpt_path=last" in out.stderr and "overwrite=true" in out.stderr
    assert file_bytes(straight, *RUN_FILES, *HYDRA_RECORD) == before  # .hydra/ too
    assert not list((straight / "checkpoints").glob("last-v*.ckpt"))


def test_a_job_slurm_requeued_resumes_in_its_own_folder_only(tmp_path: Path) -> None:
    """A requeued job (SLURM_RESTART_COUNT >= 1, the same SLURM_JOB_ID) reruns its command
    unchanged in its folder and resumes from last.ckpt; another job pointed at that folder, or
    the same command not requeued, stays refused."""
    run_dir = tmp_path / "run"
    short = ("rollout.mode=sync", "callbacks.model_checkpoint.every_n_train_steps=2")
    job = {"SLURM_JOB_ID": "4242"}
    first = run(run_dir, *short, "trainer.max_steps=4", env=job)
    assert first.returncode == 0, first.stderr[-3000:]
    longer = (*short, "trainer.max_steps=6")
    for env in ({}, {"SLURM_JOB_ID": "4243", "SLURM_RESTART_COUNT": "1"}):
        refused = run(run_dir, *longer, env=env)
        assert refused.returncode == 2 and "config key `paths.output_dir`" in refused.stderr
    out = run(run_dir, *longer, env={**job, "SLURM_RESTART_COUNT": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SLURM requeued this job" in out.stdout + out.stderr
    assert steps(run_dir) == list(range(1, 7))  # resumed at step 4: no step repeated
    assert summary(run_dir)["plan"]["ckpt_path"] == "last"


def test_a_damaged_checkpoint_fails_fast_naming_it_and_the_previous_one_resumes(
    tmp_path: Path, straight: Path
) -> None:
    """Random bytes in the middle of last.ckpt (same size, a valid container: it used to load
    and train on garbage weights). Truncated, empty and text files: tests/learner."""
    run_dir = tmp_path / "run"
    shutil.copytree(straight, run_dir, symlinks=True)
    last = run_dir / "checkpoints" / "last.ckpt"
    data = bytearray(last.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 256] = random.Random(0).randbytes(256)
    last.write_bytes(bytes(data))
    before = file_bytes(run_dir, "metrics.csv", "summary.json")

    out = run(run_dir, *SYNC, f"trainer.max_steps={STEPS + 3}", "ckpt_path=last")
    assert out.returncode == 2, out.stderr[-3000:]
    assert "config key `ckpt_path`" in out.stderr and str(last) in out.stderr
    previous = run_dir / "checkpoints" / f"step{STEPS:06d}.ckpt"
    assert f"ckpt_path={previous}" in out.stderr
    assert file_bytes(run_dir, "metrics.csv", "summary.json") == before  # nothing touched

    out = run(run_dir, *SYNC, f"trainer.max_steps={STEPS + 2}", f"ckpt_path={previous}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert steps(run_dir) == list(range(1, STEPS + 3))
    assert os.path.getsize(last) > 0 and ckpt_step(last) == STEPS + 2
