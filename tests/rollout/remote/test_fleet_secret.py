"""A real `python -m frlab.serve` process guarded by a fleet secret, as a hostile client and as
the learner see it:

- without the token, or with a wrong one, every route of the server's own route table answers
  401 with a fixed body, and changes nothing (weights, version, fault switch, verified
  afterwards with the token); a body announced huge is not read; a snapshot outside the
  server's snapshot folder is refused even with the token;
- a `python -m frlab rollout=remote` run with the secret (a file named by
  `rollout.remote.secret_file`) learns through it, and the secret appears in no file of the
  run folder (`.hydra/`, summary.json, metrics, logs, checkpoints), in its output or in the
  server's log;
- a run with another secret stops at start with a configuration error naming the keys (exit 2)
  and leaks neither secret.
"""

from __future__ import annotations

import csv
import os
import secrets
import socket
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import yaml
from helpers.serve import Fleet, free_port, save_tiny_model, url

from frlab.rollout.remote import auth, control
from frlab.rollout.remote import protocol as proto
from frlab.rollout.vllm.snapshot import write_snapshot
from frlab.serve.server import FAULT_PATH, route_table

REPO = Path(__file__).resolve().parents[3]
SECRET, WRONG = secrets.token_hex(32), secrets.token_hex(32)
STEPS = 40
pytestmark = pytest.mark.slow


def secret_file(path: Path, value: str) -> Path:
    path.write_text(value)
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One frlab.serve on loopback serving the toy architecture, with the secret, the fault
    switch and a snapshot folder."""
    root = tmp_path_factory.mktemp("guarded")
    toy = yaml.safe_load((REPO / "configs/model/toy_qwen2.yaml").read_text())["config"]
    save_tiny_model(root / "model", config=toy)
    port, snapshots = free_port(), root / "snapshots"
    extra = [
        "--test-faults",
        "--secret-file",
        str(secret_file(root / "fleet.secret", SECRET)),
        "--snapshot-root",
        str(snapshots),
    ]
    fleet = Fleet(root / "model", root, extra)
    fleet.start([port])
    try:
        yield {"url": url(port), "root": root, "snapshots": snapshots, "fleet": fleet, "port": port}
    finally:
        fleet.close()


def call(base: str, method: str, path: str, token: str | None, body: Any = None) -> httpx.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return httpx.request(
        method,
        base + path,
        headers=headers,
        trust_env=False,
        timeout=30,
        json=body if method == "POST" else None,
    )


def state_of(base: str) -> tuple[Any, ...]:
    """What a hostile request could change, read with the token: the version, and a seeded
    completion (the weights, and the fault switch: `garbage` would answer non-JSON)."""
    rpc = call(
        base, "POST", proto.COLLECTIVE_RPC, SECRET, control.rpc_request("frlab_weight_version")
    )
    body = {"prompt": [1, 2, 3], "max_tokens": 8, "temperature": 1.0, "seed": 7, "logprobs": 1}
    done = proto.parse_completion(call(base, "POST", proto.COMPLETIONS, SECRET, body).json())
    return control.rpc_versions(rpc.json()), done.token_ids, done.log_probs


def hostile_bodies(attacker_snapshot: Path) -> dict[str, Any]:
    """Bodies that would change the server if they got through."""
    load = control.rpc_request("frlab_load_snapshot", [str(attacker_snapshot), 99])
    return {
        proto.COLLECTIVE_RPC: load,
        FAULT_PATH: {"fault": "garbage"},
        proto.COMPLETIONS: {"prompt": [1, 2], "max_tokens": 4},
    }


def test_every_route_refuses_a_client_without_the_secret_and_nothing_changes(
    guarded: dict[str, Any], tmp_path: Path
) -> None:
    base = guarded["url"]
    attacker, _ = write_snapshot(
        {"model.embed_tokens.weight": torch.zeros(64, 32)}, tmp_path / "attacker", 99
    )
    bodies, before = hostile_bodies(attacker), state_of(base)
    table = route_table(test_faults=True)
    assert {proto.COLLECTIVE_RPC, FAULT_PATH, proto.COMPLETIONS} <= set(table["POST"])
    hit = []
    for method, paths in table.items():
        for path in paths:
            for token in (None, WRONG, SECRET[:-1]):
                resp = call(base, method, path, token, bodies.get(path, {}))
                if path == proto.HEALTH:
                    assert resp.status_code == 200
                    continue
                assert resp.status_code == 401, (method, path, resp.status_code)
                assert resp.content == auth.REFUSAL
                hit.append(f"{method} {path}")
    assert state_of(base) == before
    log = guarded["fleet"].log(guarded["port"])
    assert "refused POST /collective_rpc" in log and WRONG not in log and SECRET not in log
    print(f"frlab.serve: {len(set(hit))} routes refused without the secret: {sorted(set(hit))}")


def test_an_unauthenticated_huge_body_is_refused_unread(guarded: dict[str, Any]) -> None:
    with socket.create_connection(("127.0.0.1", guarded["port"]), timeout=30) as conn:
        conn.sendall(
            b"POST /collective_rpc HTTP/1.1\r\nHost: x\r\nContent-Type: "
            b"application/json\r\nContent-Length: 1000000000\r\n\r\n{"
        )
        head = conn.recv(4096)
    assert head.startswith(b"HTTP/1.1 401"), head[:200]


def test_a_snapshot_outside_the_servers_folder_is_refused_with_the_secret(
    guarded: dict[str, Any], tmp_path: Path
) -> None:
    base = guarded["url"]
    before = state_of(base)
    outside, _ = write_snapshot(
        {"model.embed_tokens.weight": torch.zeros(64, 32)}, tmp_path / "elsewhere", 5
    )
    escape = guarded["snapshots"] / "v5"  # a link inside pointing outside: still outside
    escape.parent.mkdir(parents=True, exist_ok=True)
    escape.symlink_to(outside.parent, target_is_directory=True)
    for path in (outside, escape / outside.name):
        body = control.rpc_request("frlab_load_snapshot", [str(path), 5])
        resp = call(base, "POST", proto.COLLECTIVE_RPC, SECRET, body)
        assert resp.status_code == 400 and "outside this server's snapshot folder" in resp.text
    escape.unlink()
    assert state_of(base) == before


def run_frlab(run_dir: Path, server: str, secret: Path, snapshots: Path, steps: int) -> Any:
    cmd = [
        sys.executable,
        "-m",
        "frlab",
        "rollout=remote",
        f"rollout.remote.servers=[{server}]",
        f"rollout.remote.secret_file={secret}",
        f"rollout.remote.snapshot_dir={snapshots}",
        "rollout.remote.request_timeout_s=60",
        f"trainer.max_steps={steps}",
        f"hydra.run.dir={run_dir}",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": "offline",
    }
    return subprocess.run(
        cmd, cwd=run_dir.parent, env=env, capture_output=True, text=True, timeout=900
    )


def leaks(value: str, folder: Path, *texts: str) -> list[str]:
    """Where `value` appears: files below `folder` (every one), and the texts given."""
    found = [str(p) for p in folder.rglob("*") if p.is_file() and value.encode() in p.read_bytes()]
    return found + [f"text {i}" for i, text in enumerate(texts) if value in text]


def test_a_run_with_the_secret_learns_and_leaks_it_nowhere(
    guarded: dict[str, Any], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    out = run_frlab(
        run_dir, guarded["url"], guarded["root"] / "fleet.secret", guarded["snapshots"], STEPS
    )
    assert out.returncode == 0, out.stderr[-3000:]
    with (run_dir / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("step")]
    rewards = [float(r["train/reward_mean"]) for r in rows]
    first, last = statistics.mean(rewards[:10]), statistics.mean(rewards[-10:])
    print(f"guarded frlab.serve fleet, {len(rows)} updates: reward {first:.3f} -> {last:.3f}")
    assert len(rows) == STEPS and last > first, (first, last)
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / "summary.json").is_file()
    log = guarded["fleet"].log(guarded["port"])
    assert not leaks(SECRET, run_dir, out.stdout, out.stderr, log)


def test_a_run_with_another_secret_stops_at_start_naming_the_keys(
    guarded: dict[str, Any], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    wrong = secret_file(tmp_path / "wrong.secret", WRONG)
    out = run_frlab(run_dir, guarded["url"], wrong, guarded["snapshots"], 2)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "config error" in out.stderr and "rollout.remote.secret_env" in out.stderr
    assert "HTTP 401" in out.stderr and "rollout.remote.secret_file" in out.stderr
    log = guarded["fleet"].log(guarded["port"])
    for value in (SECRET, WRONG):
        assert not leaks(value, run_dir, out.stdout, out.stderr, log), value
