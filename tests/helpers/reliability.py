"""Helpers of the reliability suite: `python -m frlab` as a real process, on the toy default.

Every wait has a deadline (DEADLINE_S, a hang detector for the suite, not a timing bound).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from frlab.tracking.metrics_file import read_metrics

DEADLINE_S = 300.0
ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HYDRA_FULL_ERROR": "0",
    "PYTHONUNBUFFERED": "1",
}
# B 16 instead of 64: shorter steps; no plots: less start-up per run.
SMALL = (
    "data.batch_size=16",
    "data.micro_batch_size=16",
    "rollout.max_in_flight=16",
    "plots=false",
)
B = 16


def command(run_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "frlab", f"hydra.run.dir={run_dir}", *SMALL, *args]


def run(
    run_dir: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run frlab to completion (or the deadline) and return its output (`env`: added)."""
    return subprocess.run(
        command(run_dir, *args),
        cwd=run_dir.parent,
        env={**ENV, **(env or {})},
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )


class Running:
    """A frlab process started in the background (output kept in a log file)."""

    def __init__(self, run_dir: Path, *args: str) -> None:
        self.run_dir = run_dir
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = run_dir.parent / f"{run_dir.name}.{time.monotonic_ns()}.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            command(run_dir, *args),
            cwd=run_dir.parent,
            env=ENV,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_for_step(self, step: int) -> int:
        """Block until metrics.csv has reached `step`; returns the last step written."""
        end = time.monotonic() + DEADLINE_S
        while time.monotonic() < end:
            done = steps(self.run_dir)
            if done and done[-1] >= step:
                return done[-1]
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"frlab exited early ({self.proc.returncode}):\n{self.output()}"
                )
            time.sleep(0.1)
        self.kill()
        raise AssertionError(f"step {step} not reached within {DEADLINE_S} s:\n{self.output()}")

    def wait_for_output(self, text: str) -> None:
        """Block until the process has printed `text`."""
        end = time.monotonic() + DEADLINE_S
        while text not in self.output():
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"frlab exited early ({self.proc.returncode}):\n{self.output()}"
                )
            if time.monotonic() > end:
                self.kill()
                raise AssertionError(f"{text!r} not printed within {DEADLINE_S} s")
            time.sleep(0.1)

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def kill(self) -> None:
        """kill -9."""
        self.proc.send_signal(signal.SIGKILL)
        self.wait()

    def wait(self) -> int:
        try:
            return self.proc.wait(DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            output = self.output()
            raise AssertionError(f"frlab did not exit within {DEADLINE_S} s:\n{output}") from None
        finally:
            self._log.close()


def steps(run_dir: Path) -> list[int]:
    return [int(r["step"]) for r in read_metrics(run_dir / "metrics.csv")]


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def ckpt_step(path: Path) -> int:
    return int(torch.load(path, map_location="cpu", weights_only=False, mmap=True)["global_step"])


def policy_params(path: Path) -> dict[str, torch.Tensor]:
    state = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
    return {k: v for k, v in state.items() if k.startswith("policy.")}


def file_bytes(run_dir: Path, *names: str) -> dict[str, bytes]:
    return {name: (run_dir / name).read_bytes() for name in names}
