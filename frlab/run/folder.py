"""One run per run folder; a resume changes nothing it should not; no leftovers of killed writes.

- `clean_partial_writes`: temporary files that a killed atomic write left behind (a checkpoint
  `.last.ckpt.<random>.tmp`, its sidecar's, `metrics.csv.tmp`, `summary.json.tmp`) are
  removed when a run starts; the files they were meant to replace are intact.
- `check_new_run`: starting a NEW run (no `ckpt_path`) in a folder that already holds a run's
  files (metrics.csv, summary.json, samples.jsonl, checkpoints) is refused with a ConfigError
  (resume it with `ckpt_path=last`, or choose another folder), unless `overwrite=true`, which
  deletes those files first. Hydra's own `.hydra/` and log file are not run files (Hydra writes
  `.hydra/` before this check runs: frlab.run.hydra_record refuses earlier and keeps it).
- `checkpoint_step`: the optimizer step a checkpoint file was taken at, so a resume of a run
  that already reached `trainer.max_steps` can say so and change nothing.
- `requeue_resume`: a job SLURM requeued (preemption, node failure, submitit's requeue at the
  time limit: the same job in the same folder, `SLURM_RESTART_COUNT` >= 1) launched without
  `ckpt_path` resumes from its folder's `last.ckpt` instead of being refused as a new run,
  when that folder is this job's own (`record_slurm_job` wrote its id there at start).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from omegaconf import DictConfig

from frlab.config.errors import ConfigError
from frlab.fsio import write_text_atomic
from frlab.tracking.metrics_file import METRICS_FILE, SUMMARY_FILE

log = logging.getLogger(__name__)

SAMPLES_FILE = "samples.jsonl"  # frlab.tracking.samples (kept Lightning-free here)
RUN_FILES = (METRICS_FILE, SUMMARY_FILE, SAMPLES_FILE)
PLOTS_DIR = "plots"
REQUEUE_COUNT = "SLURM_RESTART_COUNT"  # SLURM sets it on a requeued job: 1, 2, ...
SLURM_JOB_FILE = "slurm_job_id"  # the SLURM job that runs in this folder (requeue_resume)


def partial_writes(folder: Path) -> list[Path]:
    """Temporary files of interrupted atomic writes directly inside `folder`."""
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        name = path.name
        checkpoint_tmp = name.startswith(".") and name.endswith(".tmp")
        run_file_tmp = name in (f"{METRICS_FILE}.tmp", f"{SUMMARY_FILE}.tmp", f"{SAMPLES_FILE}.tmp")
        if path.is_file() and (checkpoint_tmp or run_file_tmp):
            found.append(path)
    return sorted(found)


def clean_partial_writes(*folders: Path) -> list[Path]:
    """Remove the temp files of killed writes in `folders`; returns what was removed."""
    removed = []
    for folder in folders:
        for path in partial_writes(folder):
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            removed.append(path)
    if removed:
        log.info("removed %d temp file(s) of interrupted writes: %s", len(removed), removed)
    return removed


def existing_run_files(output_dir: Path, ckpt_dir: Path) -> list[Path]:
    """The run files and checkpoints a previous run left in these folders."""
    found = [output_dir / name for name in RUN_FILES if (output_dir / name).exists()]
    if ckpt_dir.is_dir():
        found += sorted(p for p in ckpt_dir.iterdir() if p.name.endswith(".ckpt"))
    return found


def checkpoint_dir(cfg: Mapping[str, object], output_dir: Path) -> Path:
    """The checkpoint folder: `callbacks.model_checkpoint.dirpath`, else `<run>/checkpoints`."""
    node = (cfg.get("callbacks") or {}).get("model_checkpoint") or {}  # type: ignore[union-attr]
    return Path(str(node.get("dirpath") or output_dir / "checkpoints"))


def requeue_resume(
    ckpt_path: object, output_dir: Path, ckpt_dir: Path, environ: Mapping[str, str] | None = None
) -> object:
    """The `ckpt_path` this launch uses: as given, or `last` for a job SLURM requeued whose
    folder holds `last.ckpt` written by this very job (its id in `slurm_job_id`, recorded when
    it started); any other folder stays a new run's (refused when used)."""
    env = os.environ if environ is None else environ
    count, job = env.get(REQUEUE_COUNT, "") or "0", env.get("SLURM_JOB_ID")
    if ckpt_path is not None or not count.isdigit() or int(count) < 1 or not job:
        return ckpt_path
    try:
        mine = (output_dir / SLURM_JOB_FILE).read_text().strip() == job
    except FileNotFoundError:  # no job recorded a run here
        mine = False
    return "last" if mine and (ckpt_dir / "last.ckpt").is_file() else None


def record_slurm_job(output_dir: Path, environ: Mapping[str, str] | None = None) -> None:
    """Write this SLURM job's id into the run folder (atomically), so that a requeue of the
    same job, and only it, resumes there (`requeue_resume`)."""
    job = (os.environ if environ is None else environ).get("SLURM_JOB_ID")
    if not job:
        return
    write_text_atomic(output_dir / SLURM_JOB_FILE, job + "\n")


def resume_if_requeued(cfg: DictConfig) -> None:
    """`ckpt_path=last` on a requeued job whose folder holds its own `last.ckpt`."""
    output_dir = Path(str(cfg.paths.output_dir))
    ckpt_dir = checkpoint_dir(cfg, output_dir)
    resume = requeue_resume(cfg.get("ckpt_path"), output_dir, ckpt_dir)
    if resume != cfg.get("ckpt_path"):
        log.warning(
            "SLURM requeued this job (%s=%s): resuming from %s/last.ckpt",
            REQUEUE_COUNT,
            os.environ.get(REQUEUE_COUNT),
            ckpt_dir,
        )
        cfg.ckpt_path = resume


def check_new_run(output_dir: Path, ckpt_dir: Path, *, overwrite: bool) -> None:
    """Refuse a new run in a folder holding another run's files, or delete them (overwrite)."""
    found = existing_run_files(output_dir, ckpt_dir)
    if not found:
        return
    names = ", ".join(
        str(p.relative_to(output_dir)) if p.is_relative_to(output_dir) else str(p)
        for p in found[:6]
    )
    if not overwrite:
        raise ConfigError(
            "paths.output_dir",
            f"{output_dir} already holds a run ({names}). Resume it with ckpt_path=last, "
            "choose another folder (hydra.run.dir=...), or pass overwrite=true to delete its "
            "run files and checkpoints and start over",
        )
    log.warning("overwrite=true: deleting the previous run's files in %s (%s)", output_dir, names)
    for path in found:
        _remove(path)
        if path.suffix == ".ckpt":
            _remove(path.with_name(path.name + ".sha256"))
    _remove(output_dir / PLOTS_DIR)


def _remove(path: Path) -> None:
    """Delete a file, a folder, or a symlink together with the folder it points to (a sharded
    checkpoint); already gone is fine (several ranks may clean up at once)."""
    with contextlib.suppress(FileNotFoundError):
        if path.is_symlink():
            target = path.resolve()
            path.unlink()
            if target.is_dir():
                shutil.rmtree(target, ignore_errors=True)
        elif path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink()


def resolve_checkpoint(ckpt_path: object, ckpt_dir: Path) -> Path | None:
    """The checkpoint file a `ckpt_path` value names (`last`: `<ckpt_dir>/last.ckpt`)."""
    if ckpt_path is None:
        return None
    return ckpt_dir / "last.ckpt" if str(ckpt_path) == "last" else Path(str(ckpt_path))


def checkpoint_step(path: Path) -> int | None:
    """`global_step` of a checkpoint file (memory-mapped, tensors not read); None for a
    sharded checkpoint folder."""
    if path.is_dir():
        return None
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    step = state.get("global_step") if isinstance(state, dict) else None
    return int(step) if isinstance(step, int) else None
