"""Faulty environments and a full disk: an environment step that hangs, raises or returns a
string reward costs one rollout (counted by reason) and the run finishes; running out of space
names the folder, exits 1 and leaves the previous checkpoint intact."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers.reliability import run, steps, summary

from frlab.learner.integrity import verify_checkpoint

pytestmark = pytest.mark.slow


def test_hanging_raising_and_string_reward_steps_cost_one_rollout_each(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    faults = (
        "env=toy_faulty",
        "env.hang_every=10",
        "env.raise_every=10",
        "env.bad_reward_every=10",
        "rollout.env_timeout_s=1",
        "trainer.max_steps=6",
    )
    out = run(run_dir, *faults)
    assert out.returncode == 0, out.stderr[-3000:]
    assert steps(run_dir) == [1, 2, 3, 4, 5, 6]
    failed = summary(run_dir)["rollout_stats"]["failed_by_reason"]
    assert failed.get("env_step_timeout", 0) >= 1, failed
    assert failed.get("env_step", 0) >= 1, failed
    assert failed.get("bad_reward", 0) >= 1, failed


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    """A 1.6 MiB tmpfs (room for one toy checkpoint, not two), unmounted afterwards."""
    mount = tmp_path / "small_disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1600k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({done.stderr.strip()}): the simulated ENOSPC test "
            "in tests/learner/test_learner_integrity.py covers the message"
        )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)


def test_a_full_disk_names_the_folder_and_keeps_the_previous_checkpoint(
    tmp_path: Path, small_tmpfs: Path
) -> None:
    run_dir, ckpt_dir = tmp_path / "run", small_tmpfs / "ckpts"
    out = run(
        run_dir,
        "rollout.mode=sync",
        "trainer.max_steps=4",
        f"callbacks.model_checkpoint.dirpath={ckpt_dir}",
        "callbacks.model_checkpoint.every_n_train_steps=2",
    )
    assert out.returncode == 1, out.stderr[-3000:]
    assert f"no space left on the device holding {ckpt_dir}" in out.stderr
    assert "inline_container" not in out.stderr
    kept = sorted(p.name for p in ckpt_dir.glob("*.ckpt"))
    assert kept == ["step000002.ckpt"]  # written before the disk filled; last.ckpt never was
    verify_checkpoint(ckpt_dir / "step000002.ckpt")
    assert not [p for p in ckpt_dir.iterdir() if p.name.endswith(".tmp")]
    stopped = summary(run_dir)
    assert stopped["status"] == "failed" and "no space left" in stopped["error"]
