"""The servers of a `remote` engine as its client sees them: state, load, HTTP, counters.

`Fleet` holds one `Server` record per URL (`ok` | `stale` | `dead` | `unverified`), the
HTTP client every request, probe and load goes through (each carrying the fleet's bearer
token, each answer read only up to a bound: frlab.rollout.remote.auth, .limits; a 401 stops
the run as a configuration error), the control calls that pause, abort
and resume a server's requests, the fault and refusal counters logged as `rollout/<name>`,
and the clock of `down_reason`. It decides nothing about weights: which
server is admitted at which version is the engine's weight sync
(frlab.rollout.remote.weight_sync); it only records the outcome and picks, for each request,
the healthy server with the fewest requests in flight.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx

from frlab.errors import ConfigError
from frlab.rollout.engine import EngineError, Outage
from frlab.rollout.remote import breaker, control
from frlab.rollout.remote import protocol as proto
from frlab.rollout.remote.auth import FleetAuthError
from frlab.rollout.remote.limits import MAX_CONTROL_BYTES, AnswerRefused, read_bounded

# answers that refuse a load or a version check (EngineError, a 4xx answer, is a RuntimeError)
REFUSED = (RuntimeError, proto.MalformedResponse)

log = logging.getLogger("frlab.rollout.remote.engine")
# An idle pooled connection is dropped after this long: well before vLLM's server closes it
# (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s). At httpx's default (5 s, the same) a request can be
# sent on a connection the server is closing, fail with a transport error and mark the
# server dead.
KEEPALIVE_S = 2.0
# No cap on idle connections: httpcore 1.0's pool closes idle connections once it holds more
# than the cap in all (busy ones counted), and one it has just handed to a request that has not
# started yet is still idle: that request's connection is closed under it (a Read/WriteError
# from anyio's ClosedResourceError), which marked a healthy server dead whenever a fleet had
# more requests in flight than the cap. The pool's keep-alive expiry can do the same to a
# connection handed out just before it expires, so a request whose connection the client
# closed is sent again on a fresh one (`Fleet.send`), at most REOPENS times.
REOPENS = 2


class ServerFault(Exception):
    """A server failed a request: `kind` is dead (transport, 5xx, garbage) or stale."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class Server:
    """One generation server as the client sees it."""

    url: str
    state: str = "unverified"  # ok | stale | dead | unverified
    in_flight: int = 0
    version: int | None = None  # the version it last PROVED (its own answer)
    model: str | None = None
    why: str = ""  # why it was last refused or marked dead (shown in `_describe`)
    stops: bool = False  # vLLM-like: a resubmit update pauses it with abort (frlab...resubmit)
    paused: bool = False  # a resubmit / in_flight update paused it and has not resumed it yet
    labels: bool | None = None  # vLLM-like: labels each token's version (None: not probed yet)
    adapter: str | None = None  # LoRA: the adapter name its requests carry (frlab...remote.lora)
    marks: int = 0  # how often it was marked dead or stale (an admission under way checks it)
    failures: int = 0  # faults and failed probes in a row (its probe backoff); an answer resets it
    next_probe: float = 0.0  # time.monotonic() of its next probe while it is not ok
    down_since: float | None = None  # time.monotonic() it stopped being ok (None: it serves)
    misses: int = 0  # liveness probes in a row it did not answer (frlab.rollout.remote.breaker)
    gone: set[asyncio.Future] = field(default_factory=set)  # its requests in flight: told it died


@dataclass(frozen=True)
class Snapshot:
    """The current weights on disk: what a server must load (and acknowledge) to be admitted."""

    path: Path
    version: int
    fingerprint: Mapping[str, Any]


class Fleet:
    """The servers, the HTTP client that talks to them, and what their faults have cost."""

    def __init__(
        self,
        urls: list[str],
        request_timeout_s: float,
        probe_interval_s: float,
        fleet_down_timeout_s: float,
        headers: Mapping[str, str] | None = None,
        probe_backoff_max_s: float | None = None,
    ) -> None:
        self.servers = [Server(u) for u in urls]
        self.headers = dict(headers or {})  # the fleet's bearer token (frlab...remote.auth)
        self.request_timeout_s = float(request_timeout_s)
        self.probe_interval_s = float(probe_interval_s)
        self.backoff = breaker.Backoff(probe_interval_s, probe_backoff_max_s or probe_interval_s)
        self.fleet_down_timeout_s = float(fleet_down_timeout_s)
        self.counts: Counter[str] = Counter()
        self.client: httpx.AsyncClient | None = None
        self.last_healthy: float | None = None  # time.monotonic() a server was last seen ok
        self.auth_error: FleetAuthError | None = None  # a server refused the secret: run stops

    def open(self) -> None:
        """The HTTP client (call on the engine's event loop)."""
        timeout = httpx.Timeout(self.request_timeout_s, connect=min(5.0, self.request_timeout_s))
        limits = httpx.Limits(
            max_connections=None, max_keepalive_connections=None, keepalive_expiry=KEEPALIVE_S
        )
        headers = {**self.headers, "Accept-Encoding": "identity"}  # frlab...remote.limits
        self.client = httpx.AsyncClient(
            timeout=timeout, limits=limits, trust_env=False, headers=headers
        )

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()

    def healthy_now(self) -> bool:
        return any(s.state == "ok" for s in self.servers)

    def stats(self) -> dict[str, int]:
        """Counters and gauges for the pool's stats (logged as `rollout/<name>`)."""
        states = Counter(s.state for s in self.servers)
        return {
            "retries": self.counts["retries"],
            "servers_healthy": states["ok"],
            "servers_stale": states["stale"],
            "servers_dead": states["dead"] + states["unverified"],
            "stale_refusals": self.counts["stale_refusals"],
            "readmissions": self.counts["readmissions"],
            "server_faults": self.counts["faults"],
        }

    def down_reason(self, syncing: bool) -> str | None:
        """Not None once no server has been healthy for `fleet_down_timeout_s` (outside a sync,
        whose waits have deadlines of their own); at once after a server refused the secret."""
        if self.auth_error is not None:
            return str(self.auth_error)
        if self.last_healthy is None or syncing or self.healthy_now():
            return None
        down_for = time.monotonic() - self.last_healthy
        if down_for < self.fleet_down_timeout_s:
            return None
        return (
            f"no server of rollout.remote.servers has been healthy for {down_for:.0f} s "
            f"(rollout.remote.fleet_down_timeout_s={self.fleet_down_timeout_s:g}): "
            f"{self.describe()}"
        )

    def outage(self, syncing: bool) -> Outage | None:
        """Set while no server is healthy (outside a sync, which holds every request anyway):
        since when, each server's state, and `fleet_down_timeout_s`."""
        if self.last_healthy is None or syncing or self.healthy_now():
            return None
        return Outage(self.last_healthy, self.describe(), self.fleet_down_timeout_s)

    async def watch_forever(self) -> None:
        """Note the time while any server is healthy (the clock of `down_reason`)."""
        while True:
            if self.healthy_now():
                self.last_healthy = time.monotonic()
            await asyncio.sleep(min(self.probe_interval_s, 1.0))

    def describe(self) -> str:
        return ", ".join(
            f"{s.url}={s.state}@v{s.version}" + (f" ({s.why})" if s.why and s.state != "ok" else "")
            for s in self.servers
        )

    def pick(self) -> Server | None:
        """The healthy server with the fewest requests in flight (first listed on ties)."""
        healthy = [s for s in self.servers if s.state == "ok"]
        return min(healthy, key=lambda s: s.in_flight) if healthy else None

    async def send(
        self, method: str, url: str, max_bytes: int = MAX_CONTROL_BYTES, **kw: Any
    ) -> httpx.Response:
        """One HTTP request, its answer read up to `max_bytes` (frlab.rollout.remote.limits);
        sent again on a fresh connection (at most REOPENS times) when the client's own pool
        closed the connection under it: that is no fault of the server. A 401 raises
        FleetAuthError: the secrets differ, which no retry or other server mends."""
        reopened = 0
        while True:
            try:
                resp = await read_bounded(self.client, method, url, max_bytes, **kw)
            except httpx.TransportError as exc:
                if reopened == REOPENS or not closed_by_client(exc):
                    raise
                reopened += 1
                log.debug(
                    "remote engine: %s %s: the client closed its connection, sending it again: %r",
                    method,
                    url,
                    exc,
                )
                continue
            if resp.status_code == 401:
                refused = FleetAuthError(url.split("?", 1)[0])
                self.auth_error = self.auth_error or refused
                raise refused
            return resp

    async def post_while_up(self, server: Server, path: str, body: Any, max_bytes: int) -> Any:
        """`post`, given up with ServerFault as soon as `server` is marked dead (a stopped
        process answers nothing: its requests fail over now, not at `request_timeout_s`)."""
        done, answer = await self.while_up(
            server, self.post(server, path, body, max_bytes=max_bytes)
        )
        if not done:
            raise ServerFault("dead", f"given up on a request in flight: {answer}")
        return answer

    async def while_up(self, server: Server, work: Awaitable[Any]) -> tuple[bool, Any]:
        """Await `work` on `server` until it ends or `server` is marked dead, then cancel it:
        (True, its result), or (False, why it was marked dead)."""
        task = asyncio.ensure_future(work)
        gone = asyncio.get_running_loop().create_future()
        server.gone.add(gone)
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            server.gone.discard(gone)
        if task.done():
            return True, task.result()
        task.cancel()
        task.add_done_callback(_retrieve)
        return False, gone.result()

    async def post(
        self,
        server: Server,
        path: str,
        body: Any,
        timeout: float | None = None,
        max_bytes: int = MAX_CONTROL_BYTES,
    ) -> Any:
        """POST JSON and decode the answer; transport, 5xx, non-JSON and an answer larger
        than `max_bytes` raise ServerFault."""
        kw = {} if timeout is None else {"timeout": timeout}
        try:
            resp = await self.send("POST", server.url + path, max_bytes, json=body, **kw)
        except AnswerRefused as exc:
            raise ServerFault("dead", f"{path}: {exc}") from exc
        except httpx.TimeoutException as exc:
            raise ServerFault("dead", f"{path} timed out: {exc!r}") from exc
        except httpx.HTTPError as exc:
            raise ServerFault("dead", f"{path} transport error: {exc!r}") from exc
        return decode(resp, path)

    async def get(self, server: Server, path: str, timeout: float | None = None) -> Any:
        try:
            resp = await self.send(
                "GET", server.url + path, timeout=timeout or min(5.0, self.request_timeout_s)
            )
        except httpx.HTTPError as exc:
            raise ServerFault("dead", f"GET {path}: {exc!r}") from exc
        return decode(resp, path)

    async def healthy(self, server: Server, timeout: float | None = None) -> bool:
        """`GET /health` answered 200 within `timeout` (default: 5 s or `request_timeout_s`);
        vLLM answers with an empty body: only the status counts."""
        try:
            resp = await self.send(
                "GET",
                server.url + proto.HEALTH,
                timeout=timeout or min(5.0, self.request_timeout_s),
            )
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    def fault(self, server: Server, fault: ServerFault) -> None:
        """A request's fault: counted, and the server marked."""
        self.counts["faults"] += 1
        self.counts["stale_refusals"] += fault.kind == "stale"
        self.mark(server, fault, warn=server.state == "ok")

    def mark(self, server: Server, fault: ServerFault, *, warn: bool) -> None:
        """Mark `server` dead or stale for `fault` (a dead one is re-probed for labels, and its
        requests in flight fail over at once). Logged once per outage of the server (`warn`:
        it was serving); the faults that follow while it is down add no line."""
        if warn:
            log.warning("remote engine: server %s down (%s): %s", server.url, fault.kind, fault)
        self._down(server)
        server.state, server.why = fault.kind, str(fault)
        server.labels = None if fault.kind == "dead" else server.labels
        server.marks += 1
        if fault.kind == "dead":
            for gone in [g for g in server.gone if not g.done()]:
                gone.set_result(str(fault))

    def unresponsive(self, server: Server, why: str) -> None:
        """A serving server (or one a weight sync is verifying) missed its liveness probes
        (frlab.rollout.remote.breaker): dead, and what waits on it gives up."""
        self.counts["faults"] += 1
        self.mark(server, ServerFault("dead", why), warn=server.state in ("ok", "unverified"))

    def refuse(self, server: Server, why: str) -> None:
        self.counts["stale_refusals"] += 1
        if server.state in ("ok", "unverified"):
            log.warning("remote engine: server %s refused as stale: %s", server.url, why)
        else:  # refused again at a probe: said once already
            log.debug("remote engine: server %s refused as stale again: %s", server.url, why)
        self._down(server)
        server.state, server.why = "stale", why
        server.marks += 1

    def _down(self, server: Server) -> None:
        """A server that was serving (or being verified) stops: its outage and backoff start."""
        if server.state in ("ok", "unverified"):
            server.down_since = server.down_since or time.monotonic()
            self.probe_failed(server)

    def probe_failed(self, server: Server) -> None:
        """One more failure in a row: the next probe waits longer (`breaker.Backoff`)."""
        server.failures += 1
        server.next_probe = time.monotonic() + self.backoff.delay(server.failures)

    def served(self, server: Server) -> None:
        """`server` answered a request: its backoff starts from the beginning again."""
        server.failures = 0

    def admitted(self, server: Server, version: int, was: str) -> None:
        """`server` proved `version`: ok again (a re-admission is counted and logged once, with
        how long the server was down)."""
        server.version, server.state, server.why = version, "ok", ""
        server.misses = 0
        down_for = None if server.down_since is None else time.monotonic() - server.down_since
        server.down_since = None
        if was in ("dead", "stale"):
            self.counts["readmissions"] += 1
            log.info(
                "remote engine: server %s back after %.0f s: re-admitted at version %d",
                server.url,
                down_for or 0.0,
                version,
            )

    # -- server control: vLLM's dev-mode routes (frlab.serve answers them too) ---------------
    async def server_info(self, server: Server, model: str | None) -> Any:
        """The server's `/server_info` answer, after learning its model id (once: `model`, or
        its first `/v1/models` entry)."""
        if server.model is None:
            server.model = model or control.served_model(await self.get(server, proto.MODELS))
        # the first /server_info of a vLLM server collects its environment: allow time
        return await self.get(server, proto.SERVER_INFO, self.request_timeout_s)

    async def pause_abort(self, server: Server) -> None:
        """`POST /pause?mode=abort` (every request it holds ends as aborted, new ones queue);
        a server that refuses it is waited for as under drain; one marked dead meanwhile (its
        liveness) is given up."""
        pause = self.post(server, proto.PAUSE_ABORT, {}, timeout=self.request_timeout_s)
        try:
            await self.while_up(server, pause)
        except ServerFault as fault:
            self.fault(server, fault)
            return
        except EngineError as exc:  # 4xx: no dev-mode RL router
            log.warning(
                "remote engine: %s refused the resubmit pause, waiting for its requests "
                "instead: %s",
                server.url,
                exc,
            )
            return
        server.paused = True  # also when given up on: its re-admission resumes it

    async def freeze(self, server: Server, path: str) -> None:
        """`POST path` (a pause that keeps the KV cache: requests stop between two decode
        steps); a server that refuses has its requests aborted (they fail over); one marked
        dead meanwhile (its liveness) is given up."""
        try:
            await self.while_up(server, self.post(server, path, {}, timeout=self.request_timeout_s))
        except (ServerFault, EngineError) as exc:
            log.warning(
                "remote engine: %s refused the in_flight pause, aborting its requests: %s",
                server.url,
                exc,
            )
            await self.abort_all(server)
            return
        server.paused = True  # also when given up on: its re-admission resumes it

    async def abort_all(self, server: Server) -> None:
        """`POST /abort_requests {}`: a request queued on a paused server ends as aborted."""
        try:
            await self.post(server, proto.ABORT_REQUESTS, {}, timeout=self.request_timeout_s)
        except ServerFault as fault:
            self.fault(server, fault)
        except EngineError as exc:
            log.warning("remote engine: %s refused /abort_requests: %s", server.url, exc)

    async def resume(self, server: Server) -> None:
        """Resume one paused server (ServerFault / EngineError if it does not answer 2xx)."""
        await self.post(server, proto.RESUME, {}, timeout=self.request_timeout_s)
        server.paused = False

    async def resume_paused(self) -> None:
        """`POST /resume` on every live paused server (a dead one: at its re-admission)."""
        paused = [s for s in self.servers if s.paused and s.state != "dead"]
        results = await asyncio.gather(*(self.resume(s) for s in paused), return_exceptions=True)
        for server, result in zip(paused, results, strict=True):
            if isinstance(result, FleetAuthError):
                raise result
            if isinstance(result, ServerFault):
                self.fault(server, result)
            elif isinstance(result, Exception):
                self.fault(server, ServerFault("dead", f"/resume failed: {result}"))


def _retrieve(future: asyncio.Future) -> None:
    """Read the outcome of a request given up on, so asyncio does not report it as lost."""
    if not future.cancelled():
        future.exception()


def closed_by_client(exc: BaseException) -> bool:
    """Whether a transport error comes from the client closing its own connection (anyio's
    ClosedResourceError under httpx's error), not from the server or the network (a reset or
    an end of stream is BrokenResourceError / EndOfStream there)."""
    seen: BaseException | None = exc
    for _ in range(8):  # httpx's error <- httpcore's <- anyio's
        if seen is None:
            return False
        if isinstance(seen, anyio.ClosedResourceError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def decode(resp: httpx.Response, path: str) -> Any:
    if resp.status_code >= 500:
        raise ServerFault("dead", f"{path} answered HTTP {resp.status_code}: {resp.text[:200]}")
    if resp.status_code >= 400:
        raise EngineError(
            f"{path} refused the request (HTTP {resp.status_code}): {resp.text[:300]}"
        )
    try:
        return resp.json()
    except ValueError as exc:
        raise ServerFault("dead", f"{path} answered non-JSON: {resp.content[:60]!r}") from exc


def check_urls(servers: Sequence[str]) -> list[str]:
    """Distinct http(s) base URLs without a trailing slash (ValueError naming the config key)."""
    if isinstance(servers, str) or not servers:
        raise ConfigError(
            "rollout.remote.servers", f"must be a non-empty list of URLs, got {servers!r}"
        )
    urls = [str(u).rstrip("/") for u in servers]
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ConfigError("rollout.remote.servers", f"{url!r} is not an http(s):// base URL")
    if len(set(urls)) != len(urls):
        raise ConfigError("rollout.remote.servers", f"lists a server twice: {list(servers)}")
    return urls
