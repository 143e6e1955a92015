"""frlab's guard inside vLLM's OWN server application (`build_app` + `init_app_state`, as `vllm
serve` runs them, with the launch recipe's flags and environment: `--middleware
frlab.rollout.remote.auth.FleetGuard`, the fleet secret's file in FRLAB_FLEET_SECRET_FILE, the
value in VLLM_API_KEY): vLLM imports the guard from its `--middleware` path and adds it as the
outermost middleware; every route of the app (read in-process from its route table) answers
the guard's own 401 without the secret, /health alone open; vLLM's API-key guard is installed
behind it with the same secret; the remote engine gets in with the secret only."""

from __future__ import annotations

import os
import re
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from helpers.fleet import remote_engine
from helpers.vllm_contract import tiny_model

from frlab.rollout.remote import auth

pytestmark = pytest.mark.vllm_contract
GUARD = "frlab.rollout.remote.auth.FleetGuard"
SECRET, WRONG = secrets.token_hex(32), secrets.token_hex(32)
WEIGHTS = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2)}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    from helpers.vllm_app import VllmAppServer

    root = tmp_path_factory.mktemp("guard")
    secret_file = root / "fleet.secret"
    secret_file.write_text(SECRET)
    secret_file.chmod(0o600)
    names = (auth.SECRET_FILE_VAR, "VLLM_API_KEY")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({auth.SECRET_FILE_VAR: str(secret_file), "VLLM_API_KEY": SECRET})
    server = VllmAppServer(str(tiny_model(root / "tiny")), "--middleware", GUARD)
    try:
        server.start()
        yield server, secret_file
    finally:
        server.close()
        for name, value in saved.items():
            os.environ.pop(name, None) if value is None else os.environ.update({name: value})


def middleware_classes(app: Any) -> list[type]:
    """The app's middleware, outermost first (Starlette keeps them in that order)."""
    return [m.cls for m in app.user_middleware]


def test_vllm_loads_the_guard_from_its_import_path_as_the_outermost_middleware(guarded) -> None:
    server, _ = guarded
    classes = middleware_classes(server.app)
    assert classes[0] is auth.FleetGuard, classes
    vllm_guard = [
        m for m in server.app.user_middleware if m.cls.__name__ == "AuthenticationMiddleware"
    ]
    assert len(vllm_guard) == 1 and vllm_guard[0].kwargs["tokens"] == [SECRET]  # from the env


def handshake(url: str, path: str) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(request)
        return conn.recv(4096).split(b"\r\n", 1)[0]


def test_the_guard_sees_every_route_of_the_app(guarded) -> None:
    """Each route of vLLM's route table, each method, without the secret and with a wrong
    one: the guard's own 401 body (vLLM's guard would answer `{"error": "Unauthorized"}`,
    and only under /v1, /v2, /inference, /cohere)."""
    server, _ = guarded
    seen = []
    for route in server.app.routes:
        path = re.sub(r"\{[^}]+\}", "x", route.path)
        if type(route).__name__.endswith("WebSocketRoute"):
            assert b" 403 " in handshake(server.url, path), path
            continue
        for method in sorted(getattr(route, "methods", None) or ["GET"]):
            for token in (None, WRONG):
                headers = {} if token is None else {"Authorization": f"Bearer {token}"}
                resp = httpx.request(
                    method,
                    server.url + path,
                    headers=headers,
                    json=None,
                    timeout=30,
                    trust_env=False,
                )
                if path == auth.OPEN_PATH:
                    assert resp.status_code == 200
                    continue
                assert resp.status_code == 401, (method, path, resp.status_code)
                assert resp.content in (auth.REFUSAL, b""), (method, path)  # b"": HEAD
                seen.append(f"{method} {path}")
    dev = {
        "POST /collective_rpc",
        "POST /pause",
        "POST /resume",
        "GET /server_info",
        "POST /reset_prefix_cache",
        "POST /v1/completions",
        "GET /v1/models",
    }
    assert dev <= set(seen), sorted(dev - set(seen))
    print(
        f"vLLM app: {len(server.app.routes)} routes, {len(set(seen))} (method, path) refused: "
        f"{sorted(set(seen))}"
    )


def test_the_remote_engine_gets_in_with_the_secret_only(guarded, tmp_path: Path) -> None:
    server, secret_file = guarded
    wrong = tmp_path / "wrong.secret"
    wrong.write_text(WRONG)
    engine = remote_engine(
        [server.url],
        snapshot_dir=str(tmp_path / "a"),
        request_timeout_s=120,  # deadlines for a loaded machine (CI runs tiers side by side)
        startup_timeout_s=120,
        initial_weights=WEIGHTS,
        secret_file=str(wrong),
    )
    with pytest.raises(auth.FleetAuthError, match="HTTP 401"):
        engine.start()
    engine = remote_engine(
        [server.url],
        snapshot_dir=str(tmp_path / "b"),
        request_timeout_s=120,  # deadlines for a loaded machine (CI runs tiers side by side)
        startup_timeout_s=120,
        initial_weights=WEIGHTS,
        secret_file=str(secret_file),
    )
    engine.start()
    try:
        assert engine.stats()["servers_healthy"] == 1
    finally:
        engine.shutdown()
