"""One run per run folder: temp files of killed writes go, a used folder is refused unless
overwrite=true, which deletes the old run's files (not Hydra's)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from frlab.config.errors import ConfigError
from frlab.learner.checkpoint import AtomicCheckpointIO
from frlab.run.folder import (
    check_new_run,
    checkpoint_step,
    clean_partial_writes,
    resolve_checkpoint,
)


def _used_folder(tmp_path: Path) -> tuple[Path, Path]:
    run, ckpts = tmp_path / "run", tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    (run / ".hydra").mkdir()
    (run / ".hydra" / "config.yaml").write_text("seed: 0\n")
    (run / "frlab.log").write_text("log\n")
    (run / "metrics.csv").write_text("step\n1\n")
    (run / "summary.json").write_text("{}")
    (run / "plots").mkdir()
    (run / "plots" / "reward.png").write_bytes(b"png")
    AtomicCheckpointIO().save_checkpoint({"global_step": 7}, ckpts / "last.ckpt")
    return run, ckpts


def test_temp_files_of_killed_writes_are_removed_and_nothing_else(tmp_path: Path) -> None:
    run, ckpts = _used_folder(tmp_path)
    leftovers = [
        ckpts / ".last.ckpt.k1x2.tmp",
        ckpts / ".last.ckpt.sha256.tmp",
        run / "metrics.csv.tmp",
        run / "summary.json.tmp",
    ]
    for path in leftovers:
        path.write_bytes(b"partial")
    before = sorted(p.name for p in run.rglob("*") if p not in leftovers)
    assert sorted(clean_partial_writes(run, ckpts)) == sorted(leftovers)
    assert sorted(p.name for p in run.rglob("*")) == before


def test_a_new_run_in_a_used_folder_is_refused_naming_the_ways_out(tmp_path: Path) -> None:
    run, ckpts = _used_folder(tmp_path)
    with pytest.raises(ConfigError) as info:
        check_new_run(run, ckpts, overwrite=False)
    text = str(info.value)
    assert info.value.key == "paths.output_dir" and str(run) in text
    assert "metrics.csv" in text and "checkpoints/last.ckpt" in text
    assert "ckpt_path=last" in text and "overwrite=true" in text
    assert (run / "metrics.csv").exists() and (ckpts / "last.ckpt").exists()


def test_overwrite_deletes_the_old_runs_files_but_not_hydras(tmp_path: Path) -> None:
    run, ckpts = _used_folder(tmp_path)
    shards = ckpts / ".shards-3"  # a sharded (FSDP2) checkpoint: a symlink to a folder
    shards.mkdir()
    (shards / "0.distcp").write_bytes(b"x")
    (ckpts / "step000003.ckpt").symlink_to(shards.name)
    check_new_run(run, ckpts, overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == [".hydra", "checkpoints", "frlab.log"]
    assert list(ckpts.iterdir()) == []
    check_new_run(run, ckpts, overwrite=False)  # now empty: a new run may start


def test_an_empty_or_hydra_only_folder_is_not_a_used_run_folder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    check_new_run(run, run / "checkpoints", overwrite=False)


def test_resolve_checkpoint_and_its_step(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    assert resolve_checkpoint(None, ckpts) is None
    assert resolve_checkpoint("last", ckpts) == ckpts / "last.ckpt"
    assert resolve_checkpoint("/x/y.ckpt", ckpts) == Path("/x/y.ckpt")
    path = ckpts / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"global_step": 42, "w": torch.ones(3)}, path)
    assert checkpoint_step(path) == 42
    assert checkpoint_step(ckpts) is None  # a sharded checkpoint folder


def test_requeue_resume_resumes_only_the_requeued_job_in_its_own_folder(tmp_path: Path) -> None:
    from frlab.run.folder import record_slurm_job, requeue_resume

    run, ckpt_dir = tmp_path, tmp_path / "checkpoints"
    ckpt_dir.mkdir()
    requeued = {"SLURM_RESTART_COUNT": "2", "SLURM_JOB_ID": "77"}
    record_slurm_job(run, {"SLURM_JOB_ID": "77"})
    assert (run / "slurm_job_id").read_text() == "77\n"
    assert requeue_resume(None, run, ckpt_dir, requeued) is None  # nothing to resume: refused
    (ckpt_dir / "last.ckpt").write_bytes(b"x")
    assert requeue_resume(None, run, ckpt_dir, requeued) == "last"
    other_job = {**requeued, "SLURM_JOB_ID": "78"}  # a requeued job pointed at another's run
    assert requeue_resume(None, run, ckpt_dir, other_job) is None
    assert requeue_resume(None, run, ckpt_dir, {**requeued, "SLURM_RESTART_COUNT": "0"}) is None
    assert requeue_resume(None, run, ckpt_dir, {}) is None  # not under SLURM
    assert requeue_resume("step3.ckpt", run, ckpt_dir, requeued) == "step3.ckpt"  # as given
    (run / "slurm_job_id").unlink()  # a folder no job recorded (a run before this rule)
    assert requeue_resume(None, run, ckpt_dir, requeued) is None
    record_slurm_job(run, {})  # outside SLURM: nothing written
    assert not (run / "slurm_job_id").exists()
