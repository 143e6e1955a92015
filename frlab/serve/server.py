"""The HTTP side of `python -m frlab.serve`: vLLM's protocol subset over a `TorchEngine`.

A stdlib `ThreadingHTTPServer` (no web framework dependency): each connection gets a thread,
which hands its request to the torch engine running on one private asyncio loop, so concurrent
requests are batched by the engine as in-process ones are. Endpoints (field names as vLLM
documents them, see `frlab.rollout.remote.protocol` and `.control`) answered as vLLM answers them:
`GET /health` (200, empty body), `GET /v1/models`, `GET /server_info` (the
`vllm_config.model_config.logprobs_mode` frlab checks: processed log-probs, which the torch
engine returns; and frlab's own `frlab_weight_update`, the engine's `--weight-update` mode), `POST
/v1/completions` (penalties must be neutral or unset: the torch engine
applies none), `POST /collective_rpc` (methods `frlab_load_snapshot`, `frlab_weight_version`;
results through vLLM's router rule, `control.rpc_answer`), `POST /reset_prefix_cache`
(no cache: `{"success": true}`). vLLM's NCCL weight-transfer endpoints answer 501: this is a
CPU/test vehicle, not vLLM. A snapshot push
of the version and fingerprint already loaded (several learner ranks push identical weights to
one fleet) is answered with the same acknowledgement without reloading ("deduplicated").

Who may call it: with a fleet secret (`ServeState.secret_digest`, frlab.rollout.remote.auth)
every route but `GET /health` needs it as a bearer token, checked before a body is read (401
otherwise, the connection closed when the body is large); `route_table` lists the routes.
Snapshots are read only below `ServeState.snapshot_root` when it is set.

Test-only fault switch (`--fault`): `ignore-reload` acknowledges snapshot loads without
loading (the weights and reported version stay old: a silently stale server), `garbage`
answers completions with bytes that are not JSON, `hang` never answers completions (until the
fault is switched off), `unavailable` answers every route, `/health` included, with HTTP 503
(what a load balancer in front of a restarting server answers). With `--test-faults` the
switch can also be flipped at run time with `POST /frlab_test_fault {"fault": NAME}` (so one
server process serves several test cases; that route answers under every fault).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from frlab.rollout.remote import auth, control
from frlab.rollout.remote import protocol as proto
from frlab.rollout.torch.engine import TorchEngine
from frlab.rollout.vllm.snapshot import read_snapshot
from frlab.rollout.vllm.worker_extension import (
    SNAPSHOT_METHOD,
    VERSION_METHOD,
    check_snapshot_path,
    same_weights,
    weight_ack,
    weights_fingerprint,
)

log = logging.getLogger("frlab.serve")

FAULTS = ("none", "ignore-reload", "garbage", "hang", "unavailable")
UNREAD_LIMIT = 2**20  # a refused request's body up to this is read and dropped, else closed
FAULT_PATH = "/frlab_test_fault"
NCCL_PATHS = (
    proto.INIT_WEIGHT_TRANSFER,
    proto.START_WEIGHT_UPDATE,
    proto.UPDATE_WEIGHTS,
    proto.FINISH_WEIGHT_UPDATE,
)
# method -> path -> Handler method: the server's routes (NCCL_PATHS answer 501)
ROUTES = {
    "GET": {
        proto.HEALTH: "_health",
        proto.MODELS: "_models",
        proto.SERVER_INFO.split("?", 1)[0]: "_server_info",
    },
    "POST": {
        proto.COMPLETIONS: "_completions",
        proto.COLLECTIVE_RPC: "_rpc",
        proto.RESET_PREFIX_CACHE: "_reset_prefix_cache",
    },
}


def route_table(test_faults: bool = False) -> dict[str, list[str]]:
    """Every path a server answers, by method (`--test-faults` adds the fault switch)."""
    post = [*ROUTES["POST"], *NCCL_PATHS, *([FAULT_PATH] if test_faults else [])]
    return {"GET": list(ROUTES["GET"]), "POST": post}


@dataclass
class ServeState:
    """What every request handler shares: the engine, its loop, the served name, the fault."""

    engine: TorchEngine
    model_name: str
    fault: str = "none"
    test_faults: bool = False
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    stopping: threading.Event = field(default_factory=threading.Event)
    load_lock: threading.Lock = field(default_factory=threading.Lock)
    last_load: dict[str, Any] | None = None  # the ack of the last snapshot actually loaded
    fault_changed: threading.Condition = field(default_factory=threading.Condition)
    server: Any = None  # the running FrlabHTTPServer (set by `serve`)
    secret_digest: bytes | None = None  # the fleet secret's digest: every route but /health
    snapshot_root: Path | None = None  # snapshots are read from below it only (None: anywhere)

    def __post_init__(self) -> None:
        self.set_fault(self.fault)

    def set_fault(self, fault: str) -> None:
        """Switch the fault (wakes requests held by `hang`)."""
        if fault not in FAULTS:
            raise ValueError(f"--fault must be one of {', '.join(FAULTS)}, got {fault!r}")
        with self.fault_changed:
            self.fault = fault
            self.fault_changed.notify_all()

    def hang(self) -> None:
        """Block while the fault is `hang` and the server runs."""
        with self.fault_changed:
            while self.fault == "hang" and not self.stopping.is_set():
                self.fault_changed.wait(0.5)


class ApiError(Exception):
    """An error answered as `{"error": ...}` with an HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Handler(BaseHTTPRequestHandler):
    """One HTTP/1.1 (keep-alive) connection."""

    protocol_version = "HTTP/1.1"
    server: FrlabHTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        log.debug("%s %s", self.address_string(), format % args)

    # -- dispatch ------------------------------------------------------------------------
    def do_GET(self) -> None:
        if self._allowed():
            self._dispatch(body=None)

    def do_POST(self) -> None:
        if self._allowed():  # before the body is read
            self._dispatch(body=self._read_json())

    def _allowed(self) -> bool:
        """Whether the request may go on: `/health`, or the fleet's bearer token when the
        server has a secret; else 401 (its body is never parsed)."""
        digest = self.state.secret_digest
        if digest is None or self.path.split("?", 1)[0] == auth.OPEN_PATH:
            return True
        if auth.authorized(self.headers.get("Authorization"), digest):
            return True
        log.warning(
            "refused %s %s from %s: no valid fleet secret",
            self.command,
            self.path.split("?", 1)[0],
            self.address_string(),
        )
        length = self.headers.get("Content-Length") or "0"
        if length.isdigit() and int(length) <= UNREAD_LIMIT:
            self.rfile.read(int(length))  # a small body is dropped: the connection stays usable
        else:
            self.close_connection = True
        self.send_response(401)
        self.send_header("WWW-Authenticate", "Bearer")
        self._send_body(auth.REFUSAL, "application/json")
        return False

    def _dispatch(self, body: Any) -> None:
        path = self.path.split("?", 1)[0]
        try:
            if path in NCCL_PATHS:
                raise ApiError(501, f"{path}: NCCL weight transfer needs vLLM, not frlab.serve")
            name = ROUTES[self.command].get(path)
            if name is None and self.state.test_faults and path == FAULT_PATH:
                name = "_switch_fault"
            if name is None:
                raise ApiError(404, f"no route {self.command} {path}")
            if self.state.fault == "unavailable" and name != "_switch_fault":
                raise ApiError(503, "unavailable (the `unavailable` fault switch)")
            if body is ApiError:
                raise ApiError(400, "request body is not a JSON object")
            route = getattr(self, name)
            result = route() if body is None else route(body)
            if result == b"":  # vLLM's /health: status 200, no body
                self._send(200, result, "text/plain")
            elif isinstance(result, bytes):
                self._send(200, result, "application/octet-stream")
            else:
                self._send_json(200, {} if result is None else result)
        except ApiError as exc:
            self._send_json(exc.status, {"error": {"message": str(exc), "code": exc.status}})
        except Exception as exc:  # a server bug: answer 500, keep serving
            log.exception("request %s failed", path)
            self._send_json(500, {"error": {"message": repr(exc), "code": 500}})

    def _read_json(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw)
        except ValueError:
            return ApiError
        return body if isinstance(body, dict) else ApiError

    def _send_json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self._send_body(data, content_type)

    def _send_body(self, data: bytes, content_type: str) -> None:
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    # -- endpoints -----------------------------------------------------------------------
    @property
    def state(self) -> ServeState:
        return self.server.state

    def _health(self) -> bytes:
        return b""  # vLLM's /health: status 200, no body

    def _reset_prefix_cache(self, _body: dict[str, Any]) -> dict[str, Any]:
        return {"success": True}  # no prefix cache

    def _server_info(self) -> dict[str, Any]:
        """vLLM's answer shape plus this server's weight-update mode (`frlab_weight_update`)."""
        mode = self.state.engine.weight_update
        return control.server_info(proto.PROCESSED_LOGPROBS, weight_update=mode)

    def _models(self) -> dict[str, Any]:
        card = {"id": self.state.model_name, "object": "model", "owned_by": "frlab"}
        return {"object": "list", "data": [card]}

    def _completions(self, body: dict[str, Any]) -> Any:
        state = self.state
        try:
            prompt, params = proto.sampling_from_request(body)
        except (ValueError, TypeError) as exc:
            raise ApiError(400, f"bad completion request: {exc}") from exc
        if state.fault == "hang":
            state.hang()
            raise ApiError(503, "request held by the `hang` fault switch")
        if state.fault == "garbage":
            return b"\x00garbage{"
        future = asyncio.run_coroutine_threadsafe(state.engine.generate(prompt, params), state.loop)
        try:
            result = future.result()
        except ValueError as exc:  # ids outside the vocabulary
            raise ApiError(400, str(exc)) from exc
        log.info(
            "completion: %d tokens at versions %s",
            len(result.token_ids),
            sorted(set(result.versions)),
        )
        return proto.completion_response(
            state.model_name,
            prompt,
            result.token_ids,
            result.log_probs,
            result.versions,
            result.finish_reason,
            f"cmpl-{uuid.uuid4().hex}",
        )

    def _switch_fault(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            self.state.set_fault(str(body.get("fault")))
        except ValueError as exc:
            raise ApiError(400, str(exc)) from exc
        log.info("fault switch -> %s", self.state.fault)
        return {"fault": self.state.fault}

    def _rpc(self, body: dict[str, Any]) -> Any:
        """One worker's answer, through vLLM's router rule (`control.rpc_answer`)."""
        method, args = body.get("method"), body.get("args") or []
        if method == VERSION_METHOD:
            version = self.state.engine.version
            log.info("rpc %s -> %d", VERSION_METHOD, version)
            return control.rpc_answer([{"version": version}])
        if method == SNAPSHOT_METHOD:
            if len(args) not in (2, 3):
                raise ApiError(
                    400,
                    f"{SNAPSHOT_METHOD} takes args [path, version(, fingerprint)], got {args!r}",
                )
            fingerprint = args[2] if len(args) == 3 else None
            return control.rpc_answer(
                [self._load_snapshot(str(args[0]), int(args[1]), fingerprint)]
            )
        raise ApiError(400, f"unknown collective_rpc method {method!r}")

    def _load_snapshot(self, path: str, version: int, fingerprint: Any = None) -> dict[str, Any]:
        """Load and acknowledge; a push of the version and fingerprint already loaded (another
        learner rank's identical push) is answered with the same ack, without reloading."""
        state = self.state
        with state.load_lock:  # concurrent pushes: the first loads, the others deduplicate
            if state.engine.version == version and same_weights(
                state.last_load, version, fingerprint
            ):
                log.info("rpc %s v%d deduplicated %s", SNAPSHOT_METHOD, version, path)
                return dict(state.last_load)
            try:
                tensors = read_snapshot(check_snapshot_path(path, state.snapshot_root))
            except (FileNotFoundError, PermissionError) as exc:
                raise ApiError(400, str(exc)) from exc
            ack = weight_ack(version, weights_fingerprint(sorted(tensors.items())))
            if state.fault == "ignore-reload":
                log.info("rpc %s v%d IGNORED (fault switch)", SNAPSHOT_METHOD, version)
                return ack
            state.engine.update_weights(tensors, version)
            state.last_load = ack
        log.info("rpc %s v%d loaded %s", SNAPSHOT_METHOD, version, path)
        return ack


class FrlabHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server that carries the shared `ServeState`."""

    daemon_threads = True
    allow_reuse_address = True
    # Listen backlog: a rollout pool opens up to max_in_flight connections at once; with the
    # stdlib default (5) the kernel drops some and clients see ReadError (spurious failovers).
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], state: ServeState) -> None:
        super().__init__(address, Handler)
        self.state = state


def serve(state: ServeState, host: str, port: int, ready: threading.Event | None = None) -> None:
    """Run the engine loop and the HTTP server until `shutdown()`; stops the engine after."""
    loop_thread = threading.Thread(
        target=state.loop.run_forever, name="frlab-serve-loop", daemon=True
    )
    loop_thread.start()
    state.engine.start()
    server = FrlabHTTPServer((host, port), state)
    state.server = server
    bound = server.server_address
    log.info(
        "frlab.serve listening on http://%s:%d (model %s, version %d)",
        bound[0],
        bound[1],
        state.model_name,
        state.engine.version,
    )
    if ready is not None:
        ready.set()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        state.stopping.set()
        state.set_fault(state.fault)  # wake held requests
        server.server_close()
        state.engine.shutdown()
        state.loop.call_soon_threadsafe(state.loop.stop)
        loop_thread.join(timeout=5)
