"""Helpers of the `vllm_cpu` tier: the toy model as a folder vLLM loads, the learner's own
log-prob recomputation, `python -m frlab` runs as subprocesses, and real vLLM OpenAI servers
started through the launch recipe (scripts/launch/fleet.sh `start_server`, module entry point).

Every wait has a deadline. `REPORT` collects the figures the tier measures (printed at the end
of the session by tests/vllm_cpu/conftest.py).
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from helpers.ports import free_port as free_port  # re-exported

REPO = Path(__file__).resolve().parents[2]
REPORT: list[str] = []
EXTENSION = "frlab.rollout.vllm.worker_extension.WeightUpdateExtension"
ENGINE_ARGS = {"dtype": "float32"}  # small engines for tests: fp32, eager (the CPU default)


def toy_config(**overrides: Any) -> Any:
    """The architecture of configs/model/toy_qwen2.yaml (the CPU default's model)."""
    from frlab.model.policy import make_config

    node = yaml.safe_load((REPO / "configs/model/toy_qwen2.yaml").read_text())["config"]
    return make_config({**node, **overrides})


def save_model(folder: Path, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides: Any):
    """A random-init toy model saved as a folder vLLM loads; returns the model."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(toy_config(**overrides), dtype=dtype).eval()
    model.save_pretrained(folder)
    return model


def recompute(model: Any, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The learner's log-probs of `tokens` after `prompt` (frlab.model.lm_logprobs, the code the
    learner's loss uses), float32."""
    from frlab.model.lm_logprobs import sequence_logprobs

    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logp, _ = sequence_logprobs(model, ids, torch.ones_like(ids))
    return logp[0, len(prompt) :].float()


def perturbed(model: Any, seed: int, scale: float = 0.05) -> dict[str, torch.Tensor]:
    """A state dict near `model`'s (what a learner step produces: every weight moved; tied
    weights, one tensor under two names, stay one tensor)."""
    gen = torch.Generator().manual_seed(seed)
    moved: dict[int, torch.Tensor] = {}
    out = {}
    for name, value in model.state_dict().items():
        key = value.data_ptr()
        if key not in moved:
            moved[key] = value + scale * torch.randn(value.shape, generator=gen, dtype=value.dtype)
        out[name] = moved[key]
    return out


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout:.0f} s")
        time.sleep(interval)


def vllm_processes(root: int) -> list[Any]:
    """vLLM's engine-core and worker processes below process `root` (their titles say VLLM)."""
    import psutil

    out = []
    for child in psutil.Process(root).children(recursive=True):
        try:
            title = " ".join(child.cmdline()) + " " + child.name()
        except psutil.Error:
            continue
        if "VLLM" in title or "EngineCore" in title:
            out.append(child)
    return out


# -- python -m frlab as a subprocess -----------------------------------------------------------
def frlab_env() -> dict[str, str]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("FRLAB_REQUIRE_VLLM_CPU", None)
    return env


def start_run(run_dir: Path, overrides: list[str], log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "frlab", *overrides, f"hydra.run.dir={run_dir}"]
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        env=frlab_env(),
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def metrics(run_dir: Path) -> list[dict[str, str]]:
    path = run_dir / "metrics.csv"
    if not path.exists():
        return []
    with path.open() as f:
        return [row for row in csv.DictReader(f) if row.get("step")]


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def finish(proc: subprocess.Popen, timeout: float, log: Path) -> int:
    """The run's exit code within `timeout` (else its process group is killed and we fail)."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        raise AssertionError(f"run did not end within {timeout:.0f} s:\n{tail(log)}") from None


def tail(log: Path, chars: int = 4000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"


# -- real vLLM OpenAI servers -------------------------------------------------------------------
def fleet_secret(folder: Path) -> Path:
    """The fleet secret file of the servers started in `folder` (created once, by the launch
    recipe's own `fleet_secret`: mode 0600)."""
    path = folder / "fleet.secret"
    script = f"source scripts/launch/fleet.sh && fleet_secret '{path}'"
    subprocess.run(["bash", "-c", script], cwd=REPO, check=True, timeout=60)
    return path


class Server:
    """One `python -m vllm.entrypoints.openai.api_server` started by the launch recipe's
    `start_server` (VLLM_ENTRY=module: vLLM's CPU build has no working `vllm` command), in
    its own process group, bound to one CPU core, on loopback, behind the fleet's secret
    (`secret_file`, shared by the servers started in one folder: `headers` carry it)."""

    def __init__(
        self,
        model: Path,
        port: int,
        core: int,
        log: Path,
        max_len: int = 64,
        flags: str = "",
        env: dict[str, str] | None = None,
    ) -> None:
        self.model, self.port, self.core, self.log, self.max_len = model, port, core, log, max_len
        self.flags = flags  # more `vllm serve` flags, e.g. --enable-scale-out
        self.env = dict(env or {})  # the recipe's own switches, e.g. LORA_RANK
        self.proc: subprocess.Popen | None = None
        self.secret_file = fleet_secret(log.parent)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        """What a request to this server carries: the fleet's bearer token."""
        return {"Authorization": f"Bearer {self.secret_file.read_text().strip()}"}

    def start(self) -> None:
        extra = (
            "--skip-tokenizer-init --enforce-eager --dtype float32 "
            f"--kv-cache-memory-bytes {256 * 2**20} {self.flags}"
        )
        env = {
            **frlab_env(),
            "VLLM_ENTRY": "module",
            "VLLM_EXTRA_ARGS": extra,
            "VLLM_CPU_OMP_THREADS_BIND": str(self.core),
            "PYTHON": sys.executable,
            "HOST": "127.0.0.1",
            "FLEET_SECRET_FILE": str(self.secret_file),
            **self.env,
        }
        script = (
            f'source scripts/launch/fleet.sh && start_server "" {self.port} '
            f'"{self.model}" 1 {self.max_len} && wait'
        )
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                ["bash", "-c", script],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def healthy(self) -> bool:
        import httpx

        try:
            return httpx.get(self.url + "/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout: float = 300.0) -> None:
        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"server {self.url} exited:\n{tail(self.log)}")
            return self.healthy()

        wait_for(up, timeout, f"server {self.url} healthy", interval=1.0)

    def kill(self) -> None:
        """SIGKILL the server and everything it started (engine core, worker)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        self.proc = None
        wait_for(lambda: not self.healthy(), 30, f"server {self.url} gone")
