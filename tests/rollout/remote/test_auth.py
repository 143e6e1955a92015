"""The fleet's shared secret (frlab.rollout.remote.auth): where the learner and a server read it,
the bearer check, frlab's ASGI guard driven as vLLM's app drives it (raw ASGI calls), and a
401 at the client: a configuration error naming the keys, never a retry or a dead server."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.fleet import remote_engine

from frlab.config.compose import compose
from frlab.config.errors import ConfigError
from frlab.config.preflight import preflight
from frlab.defaults import sampling_params
from frlab.rollout.engine import EngineError
from frlab.rollout.remote import auth
from frlab.rollout.remote import protocol as proto
from frlab.rollout.remote.fleet import Fleet

SECRET = "s3cret-" + "x" * 40
OTHER = "other-" + "y" * 40


def write_secret(path: Path, value: str = SECRET, mode: int = 0o600) -> Path:
    path.write_text(value + "\n")
    path.chmod(mode)
    return path


def test_the_learner_reads_the_file_first_then_the_named_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_FLEET_SECRET", OTHER)
    assert auth.read_secret("MY_FLEET_SECRET", None) == OTHER
    assert auth.read_secret("MY_FLEET_SECRET", str(write_secret(tmp_path / "s"))) == SECRET
    monkeypatch.delenv("MY_FLEET_SECRET")
    assert auth.read_secret("MY_FLEET_SECRET", None) is None


@pytest.mark.parametrize(
    ("value", "fragment"), [("short-secret", "at least 16"), ("two words " * 3, "one word")]
)
def test_an_unusable_secret_is_refused_without_showing_it(
    value: str, fragment: str, tmp_path: Path
) -> None:
    with pytest.raises(auth.SecretError, match=fragment) as info:
        auth.read_secret(None, str(write_secret(tmp_path / "s", value)))
    assert value.strip() not in str(info.value) and "rollout.remote.secret_file" in str(info.value)
    with pytest.raises(auth.SecretError, match="cannot read"):
        auth.read_secret(None, str(tmp_path / "absent"))


def test_a_secret_file_others_may_read_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert auth.read_secret(None, str(write_secret(tmp_path / "s", mode=0o644))) == SECRET
    assert "readable by others" in caplog.text and SECRET not in caplog.text


def test_a_server_reads_the_file_its_variable_names_else_the_variable(tmp_path: Path) -> None:
    path = write_secret(tmp_path / "s")
    assert (
        auth.server_secret({auth.SECRET_FILE_VAR: str(path), "FRLAB_FLEET_SECRET": OTHER}) == SECRET
    )
    assert auth.server_secret({"FRLAB_FLEET_SECRET": OTHER}) == OTHER
    assert auth.server_secret({auth.SECRET_ENV_VAR: "MINE", "MINE": SECRET}) == SECRET
    assert auth.server_secret({}) is None


def test_the_bearer_check() -> None:
    digest = auth.digest(SECRET)
    assert auth.authorized(f"Bearer {SECRET}", digest)
    assert auth.authorized(f"bearer {SECRET}", digest)
    for header in (
        None,
        "",
        SECRET,
        f"Basic {SECRET}",
        f"Bearer {OTHER}",
        "Bearer ",
        f"Bearer {SECRET[:-1]}",
    ):
        assert not auth.authorized(header, digest), header


# -- the ASGI guard, as vLLM's app calls it ---------------------------------------------------
async def inner_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Stands for vLLM's app: answers 200 and records that a request got through."""
    scope["reached"].append(scope["path"])
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def call(guard: auth.FleetGuard, path: str, header: str | None = None, **scope: Any) -> tuple:
    """One request through `guard`: (status or the websocket close, body, paths reached)."""
    sent: list[dict[str, Any]] = []
    headers = [] if header is None else [(b"authorization", header.encode())]
    full = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": headers,
        "reached": [],
        "client": ("10.9.9.9", 4242),
        **scope,
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(guard(full, receive, send))
    status = next((m.get("status", m.get("code")) for m in sent), None)
    body = b"".join(m.get("body", b"") for m in sent)
    return status, body, full["reached"]


def test_the_guard_refuses_every_path_but_health_without_the_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    guard = auth.FleetGuard(inner_app, secret=SECRET)
    with caplog.at_level(logging.WARNING):
        call(guard, "/collective_rpc", f"Bearer {OTHER}")
    assert "refused POST /collective_rpc from 10.9.9.9" in caplog.text and OTHER not in caplog.text
    for path in (
        "/collective_rpc",
        "/pause",
        "/v1/completions",
        "/update_weight_version",
        "/v1/load_lora_adapter",
        "/health/",
        "/healthz",
        "/",
        "/metrics",
    ):
        for header in (None, f"Bearer {OTHER}", "Bearer", f"Basic {SECRET}"):
            status, body, reached = call(guard, path, header)
            assert (status, reached) == (401, []), (path, header)
            assert body == auth.REFUSAL and OTHER.encode() not in body
    assert call(guard, "/health") == (200, b"ok", ["/health"])
    assert call(guard, "/collective_rpc", f"Bearer {SECRET}")[0] == 200
    # vLLM's --root-path: the open route is /health below it
    assert call(guard, "/api/health", root_path="/api")[0] == 200
    assert call(guard, "/api/pause", root_path="/api")[0] == 401


def test_the_guard_closes_a_websocket_without_the_token_and_passes_lifespan() -> None:
    guard = auth.FleetGuard(inner_app, secret=SECRET)
    assert call(guard, "/v1/realtime", type="websocket") == (1008, b"", [])
    assert call(guard, "", type="lifespan")[2] == [""]


def test_the_guard_reads_the_servers_secret_and_will_not_start_without_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FRLAB_FLEET_SECRET", raising=False)
    monkeypatch.delenv(auth.SECRET_FILE_VAR, raising=False)
    with pytest.raises(auth.SecretError, match=auth.SECRET_FILE_VAR):
        auth.FleetGuard(inner_app)
    monkeypatch.setenv(auth.SECRET_FILE_VAR, str(write_secret(tmp_path / "s")))
    guard = auth.FleetGuard(inner_app)  # as app.add_middleware builds it: no arguments
    assert call(guard, "/pause", f"Bearer {SECRET}")[0] == 200


def test_the_guard_module_imports_nothing_heavy() -> None:
    import subprocess
    import sys

    code = (
        "import sys, frlab.rollout.remote.auth; "
        "print(sorted(m for m in ('torch', 'vllm', 'transformers', 'httpx', 'starlette') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- the learner: preflight, and a 401 at the client ------------------------------------------
@pytest.mark.parametrize(
    ("servers", "extra", "refused"),
    [
        ("[http://127.0.0.1:8100,http://localhost:8101]", [], False),
        ("[http://gpu1:8100]", [], True),
        ("[http://127.0.0.1:8100,http://10.0.0.3:8100]", [], True),
        ("[http://gpu1:8100]", ["rollout.remote.allow_unauthenticated=true"], False),
    ],
)
def test_preflight_refuses_servers_off_loopback_without_a_secret(
    servers: str, extra: list[str], refused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FRLAB_FLEET_SECRET", raising=False)
    cfg = compose(["rollout=remote", f"rollout.remote.servers={servers}", *extra])
    if not refused:
        preflight(cfg)
        return
    with pytest.raises(ConfigError) as info:
        preflight(cfg)
    assert info.value.key == "rollout.remote.secret_env"
    assert "allow_unauthenticated" in str(info.value)
    monkeypatch.setenv("FRLAB_FLEET_SECRET", SECRET)
    preflight(cfg)


def test_preflight_names_an_unreadable_secret_file(tmp_path: Path) -> None:
    cfg = compose(
        [
            "rollout=remote",
            "rollout.remote.servers=[http://gpu1:8100]",
            f"rollout.remote.secret_file={tmp_path / 'absent'}",
        ]
    )
    with pytest.raises(ConfigError) as info:
        preflight(cfg)
    assert info.value.key == "rollout.remote.secret_file"


def test_an_unauthenticated_fleet_off_loopback_is_warned_about_at_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = remote_engine(
        ["http://192.0.2.1:9"],
        allow_unauthenticated=True,
        request_timeout_s=0.5,
        startup_timeout_s=0.2,
        probe_interval_s=0.05,
    )
    with caplog.at_level(logging.WARNING), pytest.raises(EngineError):  # no server answers
        engine.start()
    assert "allow_unauthenticated=true" in caplog.text and "192.0.2.1" in caplog.text


class Guarded:
    """A MockTransport server that answers 401 unless the request carries `secret`."""

    def __init__(self, secret: str) -> None:
        self.secret, self.seen = secret, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request.headers.get("authorization"))
        if request.headers.get("authorization") != f"Bearer {self.secret}":
            return httpx.Response(401, content=auth.REFUSAL)
        return httpx.Response(200, json={"ok": True})


def fleet_of(server: Guarded, secret: str) -> Fleet:
    fleet = Fleet(["http://gpu1:8100"], 5.0, 0.05, 5.0, headers=auth.bearer_headers(secret))
    fleet.client = httpx.AsyncClient(transport=httpx.MockTransport(server), headers=fleet.headers)
    return fleet


def test_a_401_is_a_configuration_error_never_retried_nor_a_dead_server() -> None:
    server = Guarded(SECRET)
    fleet = fleet_of(server, OTHER)
    with pytest.raises(auth.FleetAuthError) as info:
        asyncio.run(fleet.post(fleet.servers[0], proto.COLLECTIVE_RPC, {}))
    assert info.value.key == "rollout.remote.secret_env" and "config key" in str(info.value)
    assert "rollout.remote.secret_file" in str(info.value) and OTHER not in str(info.value)
    assert len(server.seen) == 1  # not retried
    assert fleet.servers[0].state == "unverified" and fleet.counts["faults"] == 0
    assert "HTTP 401" in fleet.down_reason(syncing=True)  # the run stops at its next safe point


def test_every_request_carries_the_token() -> None:
    server = Guarded(SECRET)
    fleet = fleet_of(server, SECRET)
    assert asyncio.run(fleet.post(fleet.servers[0], proto.COLLECTIVE_RPC, {})) == {"ok": True}
    assert asyncio.run(fleet.get(fleet.servers[0], proto.MODELS)) == {"ok": True}
    assert server.seen == [f"Bearer {SECRET}"] * 2 and fleet.down_reason(False) is None


def test_a_server_that_refuses_the_secret_mid_run_stops_the_run_and_is_not_blamed(
    tmp_path: Path,
) -> None:
    """Admitted with the secret; then every answer is 401 (the server restarted with another
    secret): the request fails at once, no retry, no server marked, and the engine reports
    itself down (the pool stops the run at its next safe point, checkpointed)."""
    import torch
    from helpers.nccl import FakeVllmServer

    server = FakeVllmServer()
    engine = remote_engine(
        [server.url],
        snapshot_dir=str(tmp_path),
        request_timeout_s=5.0,
        startup_timeout_s=5.0,
        probe_interval_s=0.05,
        weight_update="drain",
        initial_weights={"w": torch.ones(2)},
    )
    engine.start()
    try:
        assert engine.down_reason() is None
        refusing = Guarded(OTHER)
        engine._fleet.client = httpx.AsyncClient(transport=httpx.MockTransport(refusing))
        with pytest.raises(auth.FleetAuthError):
            asyncio.run(engine.generate([1, 2], sampling_params(max_new_tokens=2)))
        assert len(refusing.seen) == 1 and engine.stats()["retries"] == 0
        assert engine.servers[0].state == "ok" and engine.stats()["server_faults"] == 0
        assert "rollout.remote.secret_env" in engine.down_reason()
    finally:
        engine.shutdown()
        server.close()
