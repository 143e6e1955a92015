"""A REAL vLLM OpenAI server on this CPU, started by the launch recipe (fleet secret, frlab's
guard, vLLM's own API-key guard, dev mode, runtime LoRA loading, the scale-out routes), as a
hostile client and as the learner see it:

- the server's own route table (read from the running app by a test-only middleware) lists
  every route frlab uses and dev mode opens; each one, with every method it takes, answers
  401 without the token and with a wrong one (a websocket handshake: 403), /health alone
  open; bodies that would replace the weights, set the version label, pause, sleep or load
  an adapter change nothing (verified afterwards with the token: weights through a seeded
  completion and the worker's version, label, adapters, pause and sleep state);
- with the token, a snapshot outside the run's snapshot folder is refused by the worker;
- a `python -m frlab rollout=remote` LoRA run with the secret file trains through it, and
  the secret appears in no file of its run folder, its log or the server's log.
"""

from __future__ import annotations

import copy
import os
import re
import secrets
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.vllm_cpu import (
    REPORT,
    Server,
    finish,
    free_port,
    metrics,
    perturbed,
    save_model,
    start_run,
    summary,
    tail,
)

from frlab.defaults import sampling_params
from frlab.rollout.remote import auth, control
from frlab.rollout.remote import generate as gen
from frlab.rollout.remote import protocol as proto
from frlab.rollout.vllm.snapshot import write_snapshot

pytestmark = pytest.mark.vllm_cpu
TESTS = Path(__file__).resolve().parents[1]  # the server imports helpers.route_table from it
WRONG = secrets.token_hex(32)
LORA = {"rank": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": ["all-linear"], "adapter": None}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("security")
    model = save_model(root / "toy", seed=0)
    snapshots = root / "snapshots"
    snapshots.mkdir()
    env = {
        "LORA_RANK": "8",
        "FLEET_SNAPSHOT_DIR": str(snapshots),
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    server = Server(
        root / "toy",
        free_port(),
        0,
        root / "server.log",
        max_len=256,
        env=env,
        flags="--enable-scale-out --middleware helpers.route_table.RouteTable",
    )
    server.start()
    try:
        server.wait_healthy()
        yield server, model, root
    finally:
        server.kill()


def ask(server: Server, method: str, path: str, body: Any = None) -> Any:
    """A request with the fleet's token; its JSON answer (raises on an error status)."""
    resp = httpx.request(method, server.url + path, headers=server.headers, timeout=120, json=body)
    resp.raise_for_status()
    return resp.json()


def served_state(server: Server) -> dict[str, Any]:
    """What a hostile request could change, read with the token."""
    models = ask(server, "GET", proto.MODELS)
    name = control.served_model(models)
    body = proto.completion_request(name, [1, 2, 3], sampling_params(max_new_tokens=8), seed=7)
    done = proto.parse_completion(ask(server, "POST", proto.COMPLETIONS, body))
    rpc = ask(server, "POST", proto.COLLECTIVE_RPC, control.rpc_request("frlab_weight_version"))
    return {
        "versions": control.rpc_versions(rpc),
        "label": ask(server, "GET", "/weight_info"),
        "models": sorted(m["id"] for m in models["data"]),
        "paused": ask(server, "GET", "/is_paused"),
        "sleeping": ask(server, "GET", "/is_sleeping"),
        "tokens": done.token_ids,
        "log_probs": done.log_probs,
    }


def hostile_requests(server: Server, model: Any, root: Path) -> dict[str, tuple[str, Any]]:
    """path -> (query, body) that would change the server if they got through: other weights
    from inside its own snapshot folder, a version label, a pause, a sleep, an adapter."""
    from frlab.model.lora import apply_lora

    snap, _ = write_snapshot(perturbed(model, seed=1), root / "snapshots" / "attacker", 99)
    adapter = apply_lora(copy.deepcopy(model), LORA)
    adapter.save_pretrained(root / "evil_adapter")
    name = str(server.model)
    return {
        proto.COLLECTIVE_RPC: ("", control.rpc_request("frlab_load_snapshot", [str(snap), 99])),
        gen.UPDATE_WEIGHT_VERSION: ("", {"new_version": "666"}),
        "/pause": ("mode=abort", {}),
        "/sleep": ("level=1", {}),
        "/v1/load_lora_adapter": (
            "",
            {"lora_name": "evil", "lora_path": str(root / "evil_adapter")},
        ),
        proto.COMPLETIONS: ("", proto.completion_request(name, [1, 2], sampling_params())),
        gen.GENERATE: ("", gen.generate_request(name, [1, 2], sampling_params())),
    }


def concrete(path: str) -> str:
    """A route's path with its parameters filled in."""
    return re.sub(r"\{[^}]+\}", "x", path)


def handshake(port: int, path: str, token: str | None) -> bytes:
    """The status line a websocket handshake gets."""
    auth_line = b"" if token is None else f"Authorization: Bearer {token}\r\n".encode()
    request = (
        (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\n"
        ).encode()
        + auth_line
        + b"\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(request)
        return conn.recv(4096).split(b"\r\n", 1)[0]


def test_every_route_refuses_a_client_without_the_secret_and_nothing_changes(guarded) -> None:
    server, model, root = guarded
    table = ask(server, "GET", "/frlab_test_routes")
    paths = {r["path"] for r in table}
    used = {
        proto.COLLECTIVE_RPC,
        proto.SERVER_INFO.split("?")[0],
        "/pause",
        "/resume",
        proto.ABORT_REQUESTS,
        gen.UPDATE_WEIGHT_VERSION,
        gen.GENERATE,
        proto.COMPLETIONS,
        proto.MODELS,
        proto.RESET_PREFIX_CACHE,
        "/v1/load_lora_adapter",
        "/sleep",
        gen.OPENAPI,
        proto.INIT_WEIGHT_TRANSFER,
    }
    assert used <= paths, sorted(used - paths)
    assert set(ask(server, "GET", gen.OPENAPI)["paths"]) <= paths  # the table is complete
    bodies, before = hostile_requests(server, model, root), served_state(server)
    refused = []
    for route in table:
        path = concrete(route["path"])
        if route["kind"].endswith("WebSocketRoute"):
            for token in (None, WRONG):
                assert b" 403 " in handshake(server.port, path, token), path
            refused.append(f"WS {path}")
            continue
        query, body = bodies.get(path, ("", {}))
        for method in route["methods"] or ["GET"]:
            for token in (None, WRONG, server.headers["Authorization"][7:-1]):
                headers = {} if token is None else {"Authorization": f"Bearer {token}"}
                resp = httpx.request(
                    method,
                    f"{server.url}{path}?{query}",
                    headers=headers,
                    json=body if method in ("POST", "PUT") else None,
                    timeout=60,
                )
                if path == auth.OPEN_PATH:
                    assert resp.status_code == 200, resp
                    continue
                assert resp.status_code == 401, (method, path, resp.status_code, resp.text[:200])
                assert resp.content in (auth.REFUSAL, b"")  # b"": HEAD
            if path != auth.OPEN_PATH:
                refused.append(f"{method} {path}")
    assert served_state(server) == before
    log = tail(server.log, 10**8)
    assert "refused POST /collective_rpc" in log and WRONG not in log
    REPORT.append(
        f"vLLM CPU server behind the recipe's guard: {len(table)} routes in its table, "
        f"{len(refused)} (route, method) pairs refused without the secret, /health "
        f"open: {sorted(refused)}"
    )


def test_a_snapshot_outside_the_runs_folder_is_refused_with_the_secret(
    guarded, tmp_path: Path
) -> None:
    server, model, _ = guarded
    before = served_state(server)
    outside, _ = write_snapshot(perturbed(model, seed=2), tmp_path / "elsewhere", 5)
    body = control.rpc_request("frlab_load_snapshot", [str(outside), 5])
    resp = httpx.post(
        server.url + proto.COLLECTIVE_RPC, json=body, headers=server.headers, timeout=120
    )
    assert resp.status_code >= 400, resp.text[:500]
    assert "outside this server's snapshot folder" in tail(server.log, 10**8)
    assert served_state(server) == before


def test_a_lora_run_with_the_secret_trains_and_leaks_it_nowhere(guarded, tmp_path: Path) -> None:
    server, _, root = guarded
    run, log = tmp_path / "run", tmp_path / "run.log"
    steps = 8
    overrides = [
        "experiment=toy_cpu",
        "rollout=remote",
        "rollout/engine=remote",
        f"rollout.remote.servers=[{server.url}]",
        "rollout.remote.request_timeout_s=60",
        "rollout.remote.startup_timeout_s=120",
        f"trainer.max_steps={steps}",
        f"rollout.remote.secret_file={server.secret_file}",
        f"rollout.remote.snapshot_dir={root / 'snapshots' / 'run'}",
        f"model.name_or_path={server.model}",
        "model.config=null",
        "model.lora.rank=8",
    ]
    proc = start_run(run, overrides, log)
    assert finish(proc, 900, log) == 0, tail(log)
    rows = metrics(run)
    assert [int(r["step"]) for r in rows] == list(range(1, steps + 1))
    assert float(rows[0]["train/sequence_kl_mean"]) < 1e-6, rows[0]
    assert summary(run)["status"] == "finished"
    value = server.secret_file.read_text().strip().encode()
    leaked = [str(p) for p in run.rglob("*") if p.is_file() and value in p.read_bytes()]
    leaked += [str(p) for p in (log, server.log) if value in p.read_bytes()]
    assert not leaked, leaked
