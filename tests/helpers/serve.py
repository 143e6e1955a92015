"""Helpers for tests that run real `python -m frlab.serve` processes on loopback.

`Fleet` starts servers in parallel (each ~5-15 s on 2 shared cores, mostly importing torch and
transformers), waits for `/health`, and always kills them (SIGKILL) on `close()`. Each server's
stderr (its request log) goes to `<tmp>/server-<port>.log`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from helpers.models import policy_of
from helpers.ports import free_port as free_port  # re-exported
from helpers.tiny import tiny_qwen2_config

TINY_QWEN2 = tiny_qwen2_config()


def save_tiny_model(path: Path, seed: int = 0, config: dict[str, Any] | None = None) -> Any:
    """Random-init a tiny Qwen2, save it to `path` (save_policy); returns the model."""
    from frlab.model.policy import save_policy

    model = policy_of(config=dict(config or TINY_QWEN2), seed=seed)
    save_policy(model, path)
    return model


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def healthy(port: int) -> bool:
    try:
        return httpx.get(url(port) + "/health", timeout=1.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


class Fleet:
    """`python -m frlab.serve` processes by port; `close()` kills every one."""

    def __init__(self, model_dir: Path, log_dir: Path, extra: Sequence[str] = ()) -> None:
        self.model_dir, self.log_dir, self.extra = Path(model_dir), Path(log_dir), list(extra)
        self.procs: dict[int, subprocess.Popen] = {}
        self.startup_s: list[float] = []

    def start(
        self, ports: Sequence[int], timeout: float = 120.0, extra: Sequence[str] = ()
    ) -> None:
        """Start servers on `ports` in parallel and wait until all answer /health."""
        t0 = time.monotonic()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        for port in ports:
            log = (self.log_dir / f"server-{port}.log").open("a")
            cmd = [
                sys.executable,
                "-m",
                "frlab.serve",
                "--port",
                str(port),
                "--model",
                str(self.model_dir),
                *self.extra,
                *extra,
            ]
            self.procs[port] = subprocess.Popen(cmd, stderr=log, stdout=log, env=env)
        for port in ports:
            while not healthy(port):
                if self.procs[port].poll() is not None:
                    raise RuntimeError(f"server {port} exited: {self.log(port)[-2000:]}")
                if time.monotonic() - t0 > timeout:
                    raise TimeoutError(f"server {port} not healthy in {timeout}s")
                time.sleep(0.05)
        self.startup_s.append(time.monotonic() - t0)

    def kill(self, port: int) -> None:
        """SIGKILL one server and reap it."""
        proc = self.procs.pop(port)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    def freeze(self, port: int) -> None:
        """SIGSTOP one server: it answers nothing until `thaw`."""
        self.procs[port].send_signal(signal.SIGSTOP)

    def thaw(self, port: int) -> None:
        self.procs[port].send_signal(signal.SIGCONT)

    def log(self, port: int) -> str:
        return (self.log_dir / f"server-{port}.log").read_text()

    def close(self) -> None:
        for port in list(self.procs):
            self.kill(port)


def set_fault(port: int, fault: str) -> None:
    """Flip a `--test-faults` server's fault switch."""
    resp = httpx.post(url(port) + "/frlab_test_fault", json={"fault": fault}, trust_env=False)
    resp.raise_for_status()
