"""Who may talk to a rollout fleet: one shared secret per fleet, read by the learner and by
every server, sent as a bearer token on every request and checked by every server on every
route but `GET /health`.

The secret never travels on a command line or in a config: the config names where to read it
(`rollout.remote.secret_env`, the NAME of an environment variable, default
`FRLAB_FLEET_SECRET`; `rollout.remote.secret_file`, a file, read first when set), and a server
reads it from the file named by `FRLAB_FLEET_SECRET_FILE`, else from the variable named by
`FRLAB_FLEET_SECRET_ENV` (default `FRLAB_FLEET_SECRET`). No error message, log line or repr
here carries the secret's value.

`FleetGuard` is a pure ASGI middleware (no starlette, torch or vllm import, so a server starts
as fast as before) that `vllm serve --middleware frlab.rollout.remote.auth.FleetGuard` adds
with `app.add_middleware`: it answers 401 to any request whose `Authorization: Bearer <secret>`
is missing or wrong, dev-mode routes included, comparing SHA-256 digests in constant time
(`hmac.compare_digest`). vLLM's own `--api-key` guards only paths under /v1, /v2, /inference
and /cohere, so alone it leaves `/collective_rpc`, `/pause`, `/resume` and the rest open.
`python -m frlab.serve` applies the same rule (`authorized`). A 401 seen by the learner is a
configuration error naming the keys (`FleetAuthError`), never a server fault.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from frlab.errors import ConfigError
from frlab.rollout.remote.hosts import is_loopback_url

log = logging.getLogger("frlab.rollout.remote.auth")
# The guard's refusals go where the ASGI server's own messages go: vLLM configures logging
# (dictConfig) after it imports the guard, which disables loggers it does not name, such as
# this module's; uvicorn configures its error logger after that.
guard_log = logging.getLogger("uvicorn.error")

DEFAULT_SECRET_ENV = "FRLAB_FLEET_SECRET"
SECRET_ENV_VAR = "FRLAB_FLEET_SECRET_ENV"  # server side: the name of the variable holding it
SECRET_FILE_VAR = "FRLAB_FLEET_SECRET_FILE"  # server side: a file holding it (read first)
OPEN_PATH = "/health"  # the one route every server answers without the secret
MIN_SECRET_CHARS = 16
KEYS = "rollout.remote.secret_env / rollout.remote.secret_file"
WHERE = (
    f"the learner reads it from {KEYS}, every server from the file {SECRET_FILE_VAR} names "
    f"or the variable {DEFAULT_SECRET_ENV} (scripts/launch/fleet.sh sets them)"
)
UNAUTHENTICATED_WARNING = (
    "remote engine: rollout.remote.allow_unauthenticated=true: this fleet has no shared secret "
    "and servers off loopback (%s): anyone who reaches a server can replace the weights it "
    f"samples from, pause it or load adapters; set {KEYS} and start the servers with it"
)
REFUSAL = json.dumps(
    {
        "error": "unauthorized: this frlab fleet server needs the fleet's "
        "shared secret as a bearer token"
    }
).encode()

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class SecretError(ValueError):
    """The fleet's secret could not be read or is unusable (the message names where from)."""


class FleetAuthError(ConfigError):
    """A server refused the learner's secret (HTTP 401): the secrets differ or one is unset.
    A configuration error naming the key (`python -m frlab` exits 2 on it), never a server
    fault; not an EngineError, so no fault handler takes it."""

    def __init__(self, url: str) -> None:
        super().__init__(
            "rollout.remote.secret_env",
            f"the server {url} refused this learner's fleet secret (HTTP 401): set the same "
            f"secret on the learner and on every server ({WHERE}); the request was not "
            "retried and the server was not marked dead",
        )


def read_secret(secret_env: str | None, secret_file: str | None) -> str | None:
    """The learner's secret: the file `secret_file` when set (it must exist), else the
    variable named `secret_env` (None when it is unset or empty). SecretError names the key."""
    if secret_file:
        return _from_file(secret_file, "rollout.remote.secret_file")
    value = os.environ.get(str(secret_env or DEFAULT_SECRET_ENV), "")
    return _checked(value, f"rollout.remote.secret_env (the variable {secret_env})") or None


def all_loopback(servers: Sequence[str]) -> bool:
    """Whether every server listed is on this host's loopback."""
    return all(is_loopback_url(u) for u in servers)


def fleet_secret(
    servers: Sequence[str],
    secret_env: str | None,
    secret_file: str | None,
    allow_unauthenticated: bool,
) -> str | None:
    """The learner's secret for this fleet (`read_secret`). ConfigError naming the key when a
    server is off loopback and there is none, unless `allow_unauthenticated` (the engine then
    warns at every start); a loopback fleet without one runs as before."""
    try:
        secret = read_secret(secret_env, secret_file)
    except SecretError as exc:
        key = "rollout.remote.secret_file" if secret_file else "rollout.remote.secret_env"
        raise ConfigError(key, str(exc)) from None
    if secret is None and not allow_unauthenticated and not all_loopback(servers):
        raise ConfigError(
            "rollout.remote.secret_env",
            f"the fleet has servers off loopback "
            f"({[u for u in servers if not is_loopback_url(u)]}) and no shared secret (the "
            f"variable {secret_env or DEFAULT_SECRET_ENV} is unset and "
            "rollout.remote.secret_file is null): anyone who reaches a server could replace "
            f"its weights; {WHERE}, or set rollout.remote.allow_unauthenticated=true to run "
            "without one on a network you trust",
        )
    return secret


def server_secret(environ: Mapping[str, str] | None = None) -> str | None:
    """A server's secret: the file `FRLAB_FLEET_SECRET_FILE` names, else the variable
    `FRLAB_FLEET_SECRET_ENV` names (default FRLAB_FLEET_SECRET); None when neither is set."""
    env = os.environ if environ is None else environ
    path = env.get(SECRET_FILE_VAR, "")
    if path:
        return _from_file(path, SECRET_FILE_VAR)
    name = env.get(SECRET_ENV_VAR, "") or DEFAULT_SECRET_ENV
    return _checked(env.get(name, ""), f"the variable {name}") or None


def _from_file(path: str, where: str) -> str:
    """The secret held in the file `path` (trailing whitespace dropped); a file that others
    may read is used, with a warning."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
        mode = file.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretError(
            f"{where}: cannot read the fleet secret file {path}: {type(exc).__name__}"
        ) from None
    if mode & 0o077:
        log.warning(
            "the fleet secret file %s is readable by others (mode %o): make it 0600",
            path,
            mode & 0o777,
        )
    secret = _checked(text.strip(), f"{where} ({path})")
    if not secret:
        raise SecretError(f"{where}: the fleet secret file {path} is empty")
    return secret


def _checked(secret: str, where: str) -> str:
    """`secret` unless it is too short or not one word of visible ASCII (SecretError naming
    `where`, never the value)."""
    if not secret:
        return secret
    if not all(33 <= ord(c) <= 126 for c in secret):
        raise SecretError(f"{where}: the fleet secret must be one word of visible ASCII")
    if len(secret) < MIN_SECRET_CHARS:
        raise SecretError(
            f"{where}: the fleet secret must have at least {MIN_SECRET_CHARS} "
            f"characters, it has {len(secret)}"
        )
    return secret


def bearer_headers(secret: str | None) -> dict[str, str]:
    """The header every fleet request carries (none without a secret)."""
    return {} if not secret else {"Authorization": f"Bearer {secret}"}


def digest(secret: str) -> bytes:
    """What a server keeps of the secret: its SHA-256 (compared in constant time)."""
    return hashlib.sha256(secret.encode("utf-8")).digest()


def authorized(header: str | None, secret_digest: bytes) -> bool:
    """Whether an `Authorization` header value carries the secret whose digest is given."""
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    return hmac.compare_digest(digest(token.strip()), secret_digest)


class FleetGuard:
    """ASGI middleware: every request but `/health` needs the fleet's bearer token (401
    otherwise, the body naming no token). Built by `app.add_middleware(FleetGuard)`; reads the
    secret as `server_secret` does, and refuses to start without one."""

    def __init__(self, app: Callable[..., Awaitable[None]], secret: str | None = None) -> None:
        secret = server_secret() if secret is None else secret
        if not secret:
            raise SecretError(
                f"frlab's FleetGuard has no fleet secret: set {SECRET_FILE_VAR} (a file) or "
                f"{DEFAULT_SECRET_ENV} in the server's environment"
            )
        self.app, self._digest = app, digest(secret)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self._open(scope):
            await self.app(scope, receive, send)
            return
        if authorized(_header(scope, b"authorization"), self._digest):
            await self.app(scope, receive, send)
            return
        guard_log.warning(
            "refused %s %s from %s: no valid fleet secret",
            scope.get("method", "WS"),
            scope.get("path"),
            (scope.get("client") or ("?",))[0],
        )
        await _refuse(scope, send)

    @staticmethod
    def _open(scope: Scope) -> bool:
        path = str(scope.get("path", ""))
        root = str(scope.get("root_path", "") or "")
        return (path[len(root) :] if root and path.startswith(root) else path) == OPEN_PATH


def _header(scope: Scope, name: bytes) -> str | None:
    """The first value of header `name` (lower case) in an ASGI scope."""
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def _refuse(scope: Scope, send: Send) -> None:
    """401 with a fixed JSON body (a websocket handshake is closed: the server answers 403)."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    headers = [
        (b"content-type", b"application/json"),
        (b"www-authenticate", b"Bearer"),
        (b"content-length", str(len(REFUSAL)).encode()),
    ]
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": REFUSAL})
