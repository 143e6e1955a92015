"""SIGTERM and SIGINT: a final checkpoint between learner steps, summary.json status, exit codes
143 / 130, an exact continuation on resume; a hung environment worker cannot keep the process
alive."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from helpers.reliability import B, Running, ckpt_step, run, steps, summary

from frlab.learner.integrity import verify_checkpoint

pytestmark = pytest.mark.slow

LONG = ("trainer.max_steps=500",)  # never reached: the signal ends the run


def _stop_with(run_dir: Path, signum: int, *args: str) -> tuple[int, str]:
    proc = Running(run_dir, *LONG, *args)
    proc.wait_for_step(3)
    proc.signal(signum)
    code = proc.wait()
    return code, proc.output()


def test_sigterm_writes_a_final_checkpoint_exits_143_and_the_resume_continues(
    tmp_path: Path,
) -> None:
    """Before: SIGTERM exited 0 and saved nothing (a scheduler saw success)."""
    run_dir = tmp_path / "run"
    code, output = _stop_with(run_dir, signal.SIGTERM)
    assert code == 143, output[-3000:]
    done = steps(run_dir)
    stopped = summary(run_dir)
    assert stopped["status"] == "interrupted" and stopped["signal"] == "SIGTERM"
    assert stopped["steps"] == done[-1] and done == list(range(1, done[-1] + 1))
    last = run_dir / "checkpoints" / "last.ckpt"
    verify_checkpoint(last)
    assert ckpt_step(last) == done[-1]  # the step the learner had finished: nothing lost

    total = done[-1] + 3
    out = run(run_dir, f"trainer.max_steps={total}", "ckpt_path=last")
    assert out.returncode == 0, out.stderr[-3000:]
    assert steps(run_dir) == list(range(1, total + 1))
    final = summary(run_dir)
    assert final["status"] == "finished" and "signal" not in final
    assert final["rollout_stats"]["consumed"] == total * B  # both segments, counted once


def test_sigint_writes_a_final_checkpoint_and_exits_130(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    code, output = _stop_with(run_dir, signal.SIGINT)
    assert code == 130, output[-3000:]
    assert "Traceback" not in output
    stopped = summary(run_dir)
    assert stopped["status"] == "interrupted" and stopped["signal"] == "SIGINT"
    assert ckpt_step(run_dir / "checkpoints" / "last.ckpt") == steps(run_dir)[-1]


def test_sigterm_stops_a_run_whose_environment_steps_hang(tmp_path: Path) -> None:
    """A quarter of the steps hang (600 s deadline): they soon hold every env thread and the
    learner waits for a batch that cannot come. Before: SIGINT/SIGTERM could not end such a
    process (the env threads were joined)."""
    run_dir = tmp_path / "run"
    proc = Running(
        run_dir, *LONG, "env=toy_faulty", "env.hang_every=4", "rollout.env_timeout_s=600"
    )
    proc.wait_for_output("updates:")  # training has started: the signal handlers are in place
    time.sleep(2.0)  # let rollouts start and hang (not a timing assertion)
    proc.signal(signal.SIGTERM)
    code = proc.wait()
    assert code == 143, proc.output()[-3000:]
    assert summary(run_dir)["status"] == "interrupted"
    done = steps(run_dir)
    assert ckpt_step(run_dir / "checkpoints" / "last.ckpt") == (done[-1] if done else 0)


def _children(pid: int) -> list[int]:
    """Direct child processes of `pid` (every thread's /proc children list)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(x) for x in (task / "children").read_text().split()]
    return found


def _running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = next(line for line in status.splitlines() if line.startswith("State:"))
    return state.split()[1] != "Z"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_the_engine_process_ends_with_its_run(tmp_path: Path, signum: int) -> None:
    """rollout/engine=torch_process: SIGTERM still exits 143 with a checkpoint of the last step;
    after SIGTERM or even SIGKILL of the learner no child process outlives it."""
    run_dir = tmp_path / "run"
    proc = Running(run_dir, *LONG, "rollout/engine=torch_process")
    proc.wait_for_step(3)
    kids = _children(proc.proc.pid)
    assert kids, "the engine runs in a child process"
    proc.signal(signum)
    code = proc.wait()
    assert code == (143 if signum == signal.SIGTERM else -9), proc.output()[-3000:]
    if signum == signal.SIGTERM:
        assert ckpt_step(run_dir / "checkpoints" / "last.ckpt") == steps(run_dir)[-1]
    deadline = time.monotonic() + 30.0
    while any(_running(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [k for k in kids if _running(k)], "an engine process outlived its run"
