"""Local `vllm serve` servers for benches on this CPU: the launch recipe's `start_server`
(scripts/launch/fleet.sh, module entry point: vLLM's CPU build has no working `vllm` command),
one server per CPU core, serving a random-init model folder of the learner's architecture (its
weights arrive from the learner as snapshot v0), with `--enable-scale-out` so that the fleet
can run `rollout.weight_update=in_flight` on vLLM's own per-token version labels. The servers
run behind a fleet secret made for them; while they run, this process holds it where a learner
looks by default (FRLAB_FLEET_SECRET), so the bench's engines send it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fleet import unused_port, wait_healthy  # bench/fleet.py: the frlab.serve fleet's helpers

from frlab.config.arguments import declared_arguments
from frlab.config.schema import ModelConfig

ROOT = Path(__file__).resolve().parents[1]
CPU_FLAGS = (
    "--skip-tokenizer-init --enforce-eager --dtype float32 "
    "--enable-scale-out --kv-cache-memory-bytes {kv}"
)


def save_architecture(config: Mapping[str, Any], folder: Path) -> Path:
    """A random-init model of `config` (a `model.config` node) saved as a folder vLLM loads."""
    from frlab.model.policy import build_policy

    build_policy(
        **declared_arguments(ModelConfig, name_or_path=None, config=dict(config)), seed=0
    ).save_pretrained(folder)
    return folder


@contextlib.contextmanager
def vllm_fleet(
    config: Mapping[str, Any],
    count: int,
    max_len: int,
    kv_bytes: int = 512 * 2**20,
    timeout_s: float = 600.0,
) -> Iterator[list[str]]:
    """`count` servers (core i for server i) on loopback; their URLs; killed on exit (logs
    under a temporary folder, named when a server fails)."""
    with tempfile.TemporaryDirectory(prefix="frlab-bench-fleet-") as tmp:
        model = save_architecture(config, Path(tmp) / "model")
        secret = Path(tmp) / "fleet.secret"
        subprocess.run(
            ["bash", "-c", f"source scripts/launch/fleet.sh && fleet_secret '{secret}'"],
            cwd=ROOT,
            check=True,
        )
        procs, urls = [], []
        held = os.environ.get("FRLAB_FLEET_SECRET")
        try:
            for core in range(count):
                port = unused_port()
                env = {
                    **os.environ,
                    "VLLM_ENTRY": "module",
                    "PYTHON": sys.executable,
                    "VLLM_EXTRA_ARGS": CPU_FLAGS.format(kv=kv_bytes),
                    "VLLM_CPU_OMP_THREADS_BIND": str(core % (os.cpu_count() or 1)),
                    "HF_HUB_OFFLINE": "1",
                    "TRANSFORMERS_OFFLINE": "1",
                    "HOST": "127.0.0.1",
                    "FLEET_SECRET_FILE": str(secret),
                }
                script = (
                    f'source scripts/launch/fleet.sh && start_server "" {port} "{model}" 1 '
                    f"{max_len} && wait"
                )
                log = (Path(tmp) / f"server{core}.log").open("w")
                procs.append(
                    subprocess.Popen(
                        ["bash", "-c", script],
                        cwd=ROOT,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
                urls.append(f"http://127.0.0.1:{port}")
            os.environ["FRLAB_FLEET_SECRET"] = secret.read_text().strip()  # this learner's
            wait_healthy(urls, procs, timeout_s)
            yield urls
        finally:
            os.environ.pop("FRLAB_FLEET_SECRET", None)
            if held is not None:
                os.environ["FRLAB_FLEET_SECRET"] = held
            for proc in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
