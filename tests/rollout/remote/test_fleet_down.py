"""A fleet whose every server dies (`python -m frlab.serve` here; real vLLM servers in
tests/vllm_cpu): the run must not fail rollouts forever. `python -m frlab` stops within
`rollout.remote.fleet_down_timeout_s`, names each server and its last error, keeps its last
step checkpointed (`last.ckpt`, resumable) and exits 75."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers.serve import Fleet, free_port, save_tiny_model, url

REPO = Path(__file__).resolve().parents[3]
DEADLINE_S = 3.0


def rows(run: Path) -> int:
    path = run / "metrics.csv"
    if not path.exists():
        return 0
    with path.open() as f:
        return sum(1 for _ in csv.DictReader(f))


@pytest.mark.slow
def test_a_fleet_that_stays_down_stops_the_run_with_exit_75(tmp_path: Path) -> None:
    ports = [free_port(), free_port()]
    toy = yaml.safe_load((REPO / "configs/model/toy_qwen2.yaml").read_text())["config"]
    save_tiny_model(tmp_path / "model", config=toy)  # the CPU default's architecture
    fleet = Fleet(tmp_path / "model", tmp_path)
    run, log = tmp_path / "run", tmp_path / "run.log"
    cmd = [
        sys.executable,
        "-m",
        "frlab",
        "rollout=remote",
        "rollout/engine=remote",
        f"rollout.remote.servers=[{','.join(url(p) for p in ports)}]",
        "rollout.remote.request_timeout_s=5",
        "rollout.remote.probe_interval_s=0.2",
        f"rollout.remote.fleet_down_timeout_s={DEADLINE_S}",
        "trainer.max_steps=100000",
        "callbacks.model_checkpoint.every_n_train_steps=1000",
        f"hydra.run.dir={run}",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    try:
        fleet.start(ports)
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + 300
            while rows(run) < 3 and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert proc.poll() is None and rows(run) >= 3, log.read_text()[-3000:]
            killed = time.monotonic()
            fleet.close()
            code = proc.wait(120)
            took = time.monotonic() - killed
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
    finally:
        fleet.close()
    text = log.read_text()
    assert code == 75, text[-3000:]
    assert "no server of rollout.remote.servers has been healthy" in text
    for port in ports:  # each server named with its state and last error
        assert f"{url(port)}=dead" in text
    assert DEADLINE_S <= took < DEADLINE_S + 30, took
    assert (run / "checkpoints" / "last.ckpt").exists()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and "EngineDown" in summary["error"]
