"""Stragglers that never finish: a user's environment (from the user's own package on
PYTHONPATH, named by `env._target_`) whose step hangs forever on some tasks. With the default
deadlines a hung call must cost one rollout, not a pipeline stall: the adaptive env deadline
(10x the p99 of recent call times, at least `rollout.env_timeout_floor_s`) gives it up, the
run finishes its updates in a few minutes without the user setting a deadline, metrics.csv
counts the stalls (`rollout/straggler_stalls`) and logs the deadline in use; and SIGTERM
during a hung call still exits promptly with the last step checkpointed."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PACKAGE = '''
import time
import zlib

from envs.toy import ParityEnv


class HangingParity(ParityEnv):
    """ParityEnv whose step never returns on the tasks that hash into `hang_percent`."""

    def __init__(self, num_digits: int = 3, hang_percent: int = 1) -> None:
        super().__init__(num_digits)
        self.hang_percent = hang_percent
        self.task = None

    def reset(self, task):
        self.task = task
        return super().reset(task)

    def step(self, action_text):
        if zlib.crc32(repr(sorted(self.task.items())).encode()) % 100 < self.hang_percent:
            time.sleep(3600)  # hangs: only a deadline gets the rollout back
        return super().step(action_text)
'''


def run(tmp_path: Path, hang_percent: int, *extra: str) -> tuple[subprocess.Popen, Path, Path]:
    pkg = tmp_path / "pkgs" / "hangpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(PACKAGE))
    env = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path / 'pkgs'}:{os.environ.get('PYTHONPATH', '')}",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    folder, log = tmp_path / "run", tmp_path / "run.log"
    cmd = [
        sys.executable,
        "-m",
        "frlab",
        "env._target_=hangpkg.HangingParity",
        f"+env.hang_percent={hang_percent}",
        f"hydra.run.dir={folder}",
        *extra,
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    return proc, folder, log


def rows(folder: Path) -> list[dict[str, str]]:
    path = folder / "metrics.csv"
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_a_run_with_hanging_steps_finishes_its_updates_in_minutes(tmp_path: Path) -> None:
    started = time.monotonic()
    proc, folder, log = run(tmp_path, 1, "trainer.max_steps=40")
    try:
        code = proc.wait(600)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.monotonic() - started
    assert code == 0, log.read_text()[-3000:]
    metrics = rows(folder)
    assert len(metrics) == 40
    assert took < 300, took  # a fixed 300 s deadline made 6 of 40 updates in 10 minutes
    last = metrics[-1]
    assert float(last["rollout/straggler_stalls"]) >= 1  # hung steps were given up
    assert float(last["rollout/failed/env_step_timeout"]) >= 1
    assert 2.0 <= float(last["rollout/env_deadline_s"]) < 60.0  # adapted down from 300 s


@pytest.mark.slow
def test_sigterm_during_a_hung_step_exits_promptly_with_the_checkpoint(tmp_path: Path) -> None:
    proc, folder, log = run(
        tmp_path,
        30,
        "trainer.max_steps=100000",
        "callbacks.model_checkpoint.every_n_train_steps=1000",
    )
    try:
        deadline = time.monotonic() + 300
        while len(rows(folder)) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None and len(rows(folder)) >= 3, log.read_text()[-3000:]
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 143, log.read_text()[-3000:]
    assert took < 8.0, took
    assert (folder / "checkpoints" / "last.ckpt").exists()
