"""Before Hydra writes into a run folder: protect its record, check the machine (Hydra callbacks).

Hydra saves `.hydra/config.yaml`, `hydra.yaml` and `overrides.yaml` into the run folder as a
job starts, before frlab's own checks run. Pointed at a folder that already holds a run
(`hydra.run.dir=...`), that would replace the record of how the earlier run was launched.
`KeepRunRecord.on_run_start` runs first (single runs; sweep folders are new per launch):

- a NEW run (no `ckpt_path`, no `overwrite=true`, not a dry run, not a SLURM requeue of the
  job that runs in this folder: frlab.run.folder.requeue_resume) in a folder that holds
  another run's files is refused right there, with the message and exit code 2 of frlab's
  run-folder check (frlab.run.folder.check_new_run), so nothing in it changes;
- otherwise (a resume, a dry run, `overwrite=true`) the existing `.hydra/*.yaml` are copied to
  `.hydra/previous/<date>_<time>/` first, so every launch's record stays in the folder.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from frlab.config.errors import ConfigError
from frlab.run.folder import check_new_run, checkpoint_dir, requeue_resume

RECORD = ("config.yaml", "hydra.yaml", "overrides.yaml")
PREVIOUS = "previous"


def keep_record(hydra_dir: Path) -> Path | None:
    """Copy the `.hydra/*.yaml` record to `.hydra/previous/<date>_<time>[_n]/` (atomically: a
    temporary folder renamed into place); the new folder, or None when there is no record."""
    files = [hydra_dir / name for name in RECORD if (hydra_dir / name).is_file()]
    if not files:
        return None
    root = hydra_dir / PREVIOUS
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    for path in files:
        shutil.copy2(path, staging / path.name)
    for n in range(1000):
        target = root / (stamp if n == 0 else f"{stamp}_{n}")
        try:
            staging.rename(target)  # fails if the name is taken: never replaces a record
            return target
        except OSError:
            continue
    raise RuntimeError(f"cannot name a folder for the previous Hydra record under {root}")


class KeepRunRecord(Callback):
    """See the module docstring."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            run_dir = Path(str(config.hydra.run.dir))
        except Exception:  # an unresolvable folder is Hydra's error to report
            return
        hydra_dir = run_dir / str(config.hydra.output_subdir or ".hydra")
        if not hydra_dir.is_dir():
            return
        ckpt_dir = _checkpoints(config, run_dir)
        resume = requeue_resume(config.get("ckpt_path"), run_dir, ckpt_dir)
        new_run = resume is None and not config.get("dry_run", False)
        if new_run and not config.get("overwrite", False):
            try:
                check_new_run(run_dir, ckpt_dir, overwrite=False)
            except ConfigError as exc:
                print(f"frlab: config error: {exc}", file=sys.stderr, flush=True)
                sys.exit(2)
        keep_record(hydra_dir)


def _checkpoints(config: DictConfig, run_dir: Path) -> Path:
    """The run's checkpoint folder, or `<run>/checkpoints` where it cannot be resolved yet
    (Hydra's runtime keys are set after this callback)."""
    try:
        return checkpoint_dir(config, run_dir)
    except Exception:  # noqa: BLE001 - an interpolation of the runtime output folder
        return run_dir / "checkpoints"


class CheckMachine(Callback):
    """The machine check of a real job (frlab.run.machine.check_machine), once: a single run's
    before Hydra creates its run folder (a GPU preset on a CPU machine leaves no folder
    behind), each job of a sweep as it starts (with its own config). It exits itself: Hydra
    turns an exception raised in a callback into a warning and goes on."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_machine(config)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.types import RunMode

        if config.hydra.mode == RunMode.MULTIRUN:
            _check_machine(config)


def _check_machine(config: DictConfig) -> None:
    if config.get("dry_run") is not False:
        return
    from frlab.run.machine import check_machine

    try:
        check_machine(config)
    except ConfigError as exc:
        print(f"frlab: config error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
