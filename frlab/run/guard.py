"""What protects one training run: its folder, its resume checkpoint, and stopping on signals.

`RunGuard.prepare(cfg, output_dir)` runs before anything heavy. It removes temp files of
killed writes, refuses a new run in a folder that holds another run (frlab.run.folder;
`overwrite=true` deletes the old files), verifies the resume checkpoint's digest (a damaged
one is a ConfigError on `ckpt_path` that names the intact checkpoint to use instead), and
notices a resume of a run that already reached `trainer.max_steps` (`finished`: nothing is
changed, the previous summary is returned).

`with guard.signals(): trainer.fit(...)` turns SIGINT and SIGTERM into a stop request
(frlab.stop) instead of an exception at an arbitrary point. The run then stops at the next
safe point: while it waits for a rollout batch, or right after the current learner step
(`guard.callback`). There a final checkpoint is written (`last.ckpt`, atomically, one process
only; with several ranks the last periodic checkpoint stays the resume point), summary.json
records `status: interrupted` and the signal, and `RunInterrupted` leaves `fit` so the command
exits with 130 (SIGINT) or 143 (SIGTERM). A step still running GRACE_S seconds after the
signal, or a second signal, stops the run at once, without a final checkpoint; a third signal
gets the system's default action.
"""

from __future__ import annotations

import _thread
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback
from omegaconf import DictConfig

from frlab import stop
from frlab.config.errors import ConfigError
from frlab.config.plan import NOT_RESOLVED
from frlab.learner.integrity import CheckpointCorrupt, verify_checkpoint
from frlab.rollout.engine import EngineDown
from frlab.run.folder import (
    check_new_run,
    checkpoint_dir,
    checkpoint_step,
    clean_partial_writes,
    record_slurm_job,
    resolve_checkpoint,
)
from frlab.stop import RunInterrupted
from frlab.tracking.metrics_file import SUMMARY_FILE

log = logging.getLogger(__name__)

GRACE_S = 30.0  # how long a learner step may still run after SIGINT/SIGTERM
SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class RunGuard:
    """The run folder's state at start, the signal handling and the stop callback of one run."""

    output_dir: Path
    ckpt_dir: Path
    checkpoint: Path | None = None
    finished: bool = False
    previous_summary: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stopper = _SignalStop()
        self.callback = GracefulStop(self._stopper)

    @classmethod
    def prepare(cls, cfg: Any, output_dir: Path) -> RunGuard:
        """Check and tidy the run folder before anything heavy (see the module docstring)."""
        ckpt_dir = checkpoint_dir(cfg, output_dir)
        clean_partial_writes(output_dir, ckpt_dir)
        checkpoint = resolve_checkpoint(cfg.get("ckpt_path"), ckpt_dir)
        if checkpoint is None:
            check_new_run(output_dir, ckpt_dir, overwrite=bool(cfg.get("overwrite", False)))
            return cls(output_dir, ckpt_dir)
        try:
            verify_checkpoint(checkpoint)
            step = checkpoint_step(checkpoint)
        except CheckpointCorrupt as exc:
            raise ConfigError("ckpt_path", str(exc)) from exc
        except Exception as exc:  # digest fine but torch cannot read it: a foreign file
            problem = CheckpointCorrupt(checkpoint, f"torch cannot read it: {exc}")
            raise ConfigError("ckpt_path", str(problem)) from exc
        max_steps = int(cfg.trainer.max_steps)
        guard = cls(output_dir, ckpt_dir, checkpoint, step is not None and step >= max_steps)
        if guard.finished:
            guard.previous_summary = _read_summary(output_dir)
            log.warning(
                "nothing to do: %s is at step %d and trainer.max_steps=%d, so this run already "
                "finished; its files are unchanged (raise trainer.max_steps to train further)",
                checkpoint,
                step,
                max_steps,
            )
        return guard

    @contextlib.contextmanager
    def signals(self) -> Iterator[None]:
        """SIGINT/SIGTERM become a stop request for the duration of the block (see above)."""
        self._stopper.install()
        try:
            yield
        except BaseException as exc:
            if _is_lightning_sigterm(exc):  # Lightning's own SIGTERM stop: exit status 0
                raise RunInterrupted(signal.SIGTERM, safe=True) from None
            raise
        finally:
            self._stopper.uninstall()


class _SignalStop:
    """Signal handlers: first signal -> stop request + grace timer; second -> stop now."""

    def __init__(self, grace_s: float = GRACE_S) -> None:
        self.grace_s = grace_s
        self._previous: dict[int, Any] = {}
        self._timer: threading.Timer | None = None
        self._forced = False

    def install(self) -> None:
        stop.clear()
        self._forced = False
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)

    def uninstall(self) -> None:
        self.cancel_timer()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _handle(self, signum: int, frame: Any) -> None:
        first = stop.stop_signal()
        if first is None:
            stop.request_stop(signum)
            log.warning(
                "%s received: stopping at the next safe point (within %.0f s) with a final "
                "checkpoint; send it again to stop at once",
                signal.Signals(signum).name,
                self.grace_s,
            )
            self._timer = threading.Timer(self.grace_s, _thread.interrupt_main, (signum,))
            self._timer.daemon = True
            self._timer.start()
            return
        if self._forced:
            for sig in SIGNALS:  # a third signal: the system's default action
                signal.signal(sig, signal.SIG_DFL)
            return
        self._forced = True
        self.cancel_timer()
        log.warning("stopping now, during a learner step: no final checkpoint")
        raise RunInterrupted(first, safe=False)


class GracefulStop(Callback):
    """Stops after a learner step when a stop was requested; writes the final checkpoint."""

    def __init__(self, stopper: _SignalStop | None = None) -> None:
        self._stopper = stopper

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *_: Any) -> None:
        stop.raise_if_stop_requested()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """The last step is checkpointed too (`every_n_train_steps` may not divide
        max_steps), so a finished run resumes as finished and can be extended exactly."""
        callback = getattr(trainer, "checkpoint_callback", None)
        saved = getattr(callback, "_last_global_step_saved", None)
        if callback is not None and saved != trainer.global_step:
            # every rank is here together, so the collective save is safe with several ranks
            save_final_checkpoint(trainer, reason="end of training", all_ranks_here=True)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self._stopper is not None:
            self._stopper.cancel_timer()  # stopping now: no escalation during the final save
        safe = (
            (isinstance(exception, RunInterrupted) and exception.safe)
            or isinstance(exception, EngineDown)  # raised while waiting for a batch
            or _is_lightning_sigterm(exception)
        )
        if safe:
            path = save_final_checkpoint(trainer)
            if path is not None:
                log.warning("resume with ckpt_path=last (final checkpoint %s)", path)


def save_final_checkpoint(
    trainer: Any, reason: str = "stop", all_ranks_here: bool = False
) -> Path | None:
    """Write `last.ckpt` into the checkpoint callback's folder now. Saving is collective, so
    with several ranks only where every rank is known to call it (`all_ranks_here`)."""
    callback = getattr(trainer, "checkpoint_callback", None)
    dirpath = getattr(callback, "dirpath", None)
    if dirpath is None:
        log.warning("no final checkpoint: the run has no checkpoint callback")
        return None
    if int(getattr(trainer, "world_size", 1)) > 1 and not all_ranks_here:
        log.warning("no final checkpoint with several ranks: resume from the last periodic one")
        return None
    path = Path(dirpath) / f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}"
    try:
        trainer.save_checkpoint(path, weights_only=False)
    except Exception as exc:  # the previous checkpoint stays; the stop must go on
        log.error("final checkpoint not written (%s); the previous one is intact", exc)
        return None
    log.info("final checkpoint (%s) at step %d: %s", reason, trainer.global_step, path)
    return path


def _is_lightning_sigterm(exc: BaseException) -> bool:
    return type(exc).__name__ == "SIGTERMException"


def _read_summary(output_dir: Path) -> dict[str, Any]:
    import json

    try:
        return dict(json.loads((output_dir / SUMMARY_FILE).read_text()))
    except (OSError, ValueError):
        return {"status": "finished", "output_dir": str(output_dir)}


def exit_now(code: int) -> None:
    """Exit with `code` even if a hung non-daemon thread remains (it would block exit)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    alive = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if alive:
        os._exit(code)
    sys.exit(code)


def check_resume(ckpt_path: Any, cfg: DictConfig, output_dir: Path) -> None:
    """`ckpt_path=last` needs `last.ckpt` in this run folder's checkpoint dir (the default
    run folder has a timestamp: pass `hydra.run.dir=<the old run folder>`); an explicit path
    must exist. Lightning would only warn and silently start from scratch."""
    if ckpt_path is None:
        return
    if str(ckpt_path) == "last":
        node = (cfg.get("callbacks") or {}).get("model_checkpoint") or {}
        last = Path(str(node.get("dirpath") or output_dir / "checkpoints")) / "last.ckpt"
        if not os.path.lexists(last):
            raise ConfigError(
                "ckpt_path",
                f"=last but {last} does not exist: nothing to resume. Point hydra.run.dir at "
                "the run folder to resume (the default folder name has a new timestamp), or "
                "pass ckpt_path=<path to a .ckpt>",
            )
        return
    if not os.path.exists(str(ckpt_path)):
        raise ConfigError("ckpt_path", f"checkpoint {ckpt_path} does not exist")


def run_folder(cfg: DictConfig, folder: str) -> tuple[Path, Any]:
    """The run folder `folder` (created) and its RunGuard, after checking that a resume has
    something to resume and that a new run does not overwrite another's files."""
    if folder == NOT_RESOLVED:
        raise ConfigError("paths.output_dir", "cannot be resolved outside a Hydra run: set it")
    output_dir = Path(folder)
    check_resume(cfg.get("ckpt_path"), cfg, output_dir)
    guard = RunGuard.prepare(cfg, output_dir)  # used folder, resume checkpoint, temp files
    output_dir.mkdir(parents=True, exist_ok=True)
    record_slurm_job(output_dir)  # a requeue of this job resumes here (requeue_resume)
    return output_dir, guard
