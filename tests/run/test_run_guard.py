"""frlab.run.guard and frlab.stop: SIGINT/SIGTERM become a stop request honoured at a safe
point (with a final checkpoint), a second signal stops at once, a step that outlives the grace
period is interrupted; the run folder is checked before anything heavy."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from frlab import stop
from frlab.config.errors import ConfigError
from frlab.learner.checkpoint import AtomicCheckpointIO
from frlab.run.guard import GracefulStop, RunGuard, _SignalStop, save_final_checkpoint
from frlab.stop import RunInterrupted, exception_status

HANG_GUARD_S = 60.0


def _cfg(tmp_path: Path, **root) -> object:
    return OmegaConf.create(
        {
            "trainer": {"max_steps": 10},
            "ckpt_path": None,
            "overwrite": False,
            "callbacks": {"model_checkpoint": {"dirpath": None}},
            **root,
        }
    )


@pytest.fixture
def stopper():
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    stopper = _SignalStop(grace_s=HANG_GUARD_S)
    stopper.install()
    yield stopper
    stopper.uninstall()
    stop.clear()
    assert {s: signal.getsignal(s) for s in handlers} == handlers  # restored


def test_a_first_signal_only_requests_a_stop_and_a_second_stops_at_once(stopper) -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # handled in this (the main) thread, no exception
    assert stop.stop_signal() == signal.SIGTERM
    with pytest.raises(RunInterrupted) as info:
        stop.raise_if_stop_requested()
    assert info.value.safe and info.value.exit_code == 143
    with pytest.raises(RunInterrupted) as info:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)  # the handler runs at the next bytecode
    assert not info.value.safe and info.value.signal_name == "SIGTERM"


def test_a_step_still_running_after_the_grace_period_is_interrupted() -> None:
    stopper = _SignalStop(grace_s=0.2)
    stopper.install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(RunInterrupted) as info:
            end = time.monotonic() + HANG_GUARD_S
            while time.monotonic() < end:  # a learner step that does not end
                time.sleep(0.01)
        assert not info.value.safe and info.value.exit_code == 130
    finally:
        stopper.uninstall()
        stop.clear()


def test_the_callback_stops_after_the_step_and_writes_the_final_checkpoint(
    tmp_path: Path, stopper
) -> None:
    saved: list[Path] = []
    callback_ = SimpleNamespace(
        dirpath=str(tmp_path),
        CHECKPOINT_NAME_LAST="last",
        FILE_EXTENSION=".ckpt",
        _last_global_step_saved=3,
    )
    trainer = SimpleNamespace(
        checkpoint_callback=callback_,
        world_size=1,
        global_step=5,
        save_checkpoint=lambda path, weights_only=None: saved.append(Path(path)),
    )
    guard = GracefulStop(stopper)
    guard.on_train_batch_end(trainer, None)  # no stop requested: nothing happens
    os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(RunInterrupted) as info:
        guard.on_train_batch_end(trainer, None)
    guard.on_exception(trainer, None, info.value)
    assert saved == [tmp_path / "last.ckpt"]
    guard.on_exception(trainer, None, RunInterrupted(signal.SIGTERM, safe=False))
    guard.on_exception(trainer, None, RuntimeError("a crash mid-step"))
    assert saved == [tmp_path / "last.ckpt"]  # never from an inconsistent state
    guard.on_train_end(trainer, None)  # the last step (5) was not checkpointed yet
    assert saved == [tmp_path / "last.ckpt"] * 2


def test_no_signal_checkpoint_with_several_ranks_or_without_a_checkpoint_callback() -> None:
    calls: list[str] = []
    trainer = SimpleNamespace(
        checkpoint_callback=SimpleNamespace(dirpath="/x"),
        world_size=2,
        save_checkpoint=lambda *a, **k: calls.append("saved"),
    )
    assert save_final_checkpoint(trainer) is None
    trainer.checkpoint_callback.CHECKPOINT_NAME_LAST = "last"
    trainer.checkpoint_callback.FILE_EXTENSION = ".ckpt"
    trainer.global_step = 4
    assert save_final_checkpoint(trainer, all_ranks_here=True) == Path("/x/last.ckpt")  # train end
    assert calls == ["saved"]
    calls.clear()
    trainer.checkpoint_callback, trainer.world_size = None, 1
    assert save_final_checkpoint(trainer) is None and calls == []


def test_lightnings_own_sigterm_exit_becomes_run_interrupted(tmp_path: Path) -> None:
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    guard = RunGuard(tmp_path, tmp_path / "checkpoints")
    with pytest.raises(RunInterrupted) as info, guard.signals():
        raise SIGTERMException  # a SystemExit: the command would have exited 0
    assert info.value.exit_code == 143


def test_exception_status() -> None:
    assert exception_status(RunInterrupted(signal.SIGINT, True)) == {
        "status": "interrupted",
        "signal": "SIGINT",
    }
    assert exception_status(KeyboardInterrupt()) == {"status": "interrupted", "signal": "SIGINT"}
    assert exception_status(ValueError("x")) == {"status": "failed"}


def test_prepare_refuses_a_used_folder_for_a_new_run(tmp_path: Path) -> None:
    (tmp_path / "metrics.csv").write_text("step\n1\n")
    with pytest.raises(ConfigError, match="already holds a run"):
        RunGuard.prepare(_cfg(tmp_path), tmp_path)
    guard = RunGuard.prepare(_cfg(tmp_path, overwrite=True), tmp_path)
    assert guard.checkpoint is None and not (tmp_path / "metrics.csv").exists()


def test_prepare_notices_a_finished_run_and_returns_its_summary_untouched(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    AtomicCheckpointIO().save_checkpoint({"global_step": 10}, ckpts / "last.ckpt")
    (tmp_path / "summary.json").write_text(json.dumps({"status": "finished", "steps": 10}))
    guard = RunGuard.prepare(_cfg(tmp_path, ckpt_path="last"), tmp_path)
    assert guard.finished and guard.previous_summary == {"status": "finished", "steps": 10}
    more = OmegaConf.merge(_cfg(tmp_path, ckpt_path="last"), {"trainer": {"max_steps": 11}})
    assert not RunGuard.prepare(more, tmp_path).finished


def test_prepare_refuses_a_damaged_resume_checkpoint_naming_ckpt_path(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    AtomicCheckpointIO().save_checkpoint({"global_step": 5}, ckpts / "step000005.ckpt")
    AtomicCheckpointIO().save_checkpoint({"global_step": 10}, ckpts / "last.ckpt")
    (ckpts / "last.ckpt").write_text("oops")
    with pytest.raises(ConfigError) as info:
        RunGuard.prepare(_cfg(tmp_path, ckpt_path="last"), tmp_path)
    assert info.value.key == "ckpt_path" and str(ckpts / "last.ckpt") in str(info.value)
    assert f"ckpt_path={ckpts / 'step000005.ckpt'}" in str(info.value)
