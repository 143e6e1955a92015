"""The fleet side of the `remote` engine: server state, admission, probing, HTTP calls.

`FleetMixin` is mixed into `frlab.rollout.remote.engine.RemoteEngine` (which owns the event
loop, the request gate and weight sync). A server is `ok` only after it reported
`logprobs_mode=processed_logprobs` (`GET /server_info`, vLLM's dev mode) and the fleet's
current weight version in answer to `frlab_weight_version` (having first loaded and
acknowledged the current snapshot, if there is one, and reset its prefix cache with
success); `stale` when it reported another version or mode, did not acknowledge the load or
the reset; `dead` after a transport error, a timeout, an HTTP 5xx or a malformed answer;
`unverified` before its first check or during a sync. Only `ok` servers get requests; the
prober re-checks the others every `probe_interval_s` once `/health` answers 200 (vLLM's
health answer has an empty body: the status code is the answer). A frlab.serve server reports
its own weight-update mode in `/server_info`, which must be the fleet's `in_flight` /
`resubmit` when it asks one; a server without it (vLLM) is one a resubmit update pauses
(`stops`), and one left paused is resumed before it is re-admitted
(frlab.rollout.remote.resubmit). Under in_flight a vLLM server must also label tokens (probed
at admission, its label set to the current version before it is verified; its prefix cache is
not reset while an update holds it frozen: frlab.rollout.remote.in_flight). With LoRA the
current adapter is loaded instead, and its listing in `/v1/models` is the version proof
(frlab.rollout.remote.lora).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from frlab.rollout.engine import EngineError
from frlab.rollout.remote import control
from frlab.rollout.remote import protocol as proto
from frlab.rollout.remote.worker_extension import SNAPSHOT_METHOD, VERSION_METHOD, check_acks

REFUSED = (RuntimeError, proto.MalformedResponse)  # EngineError (a 4xx answer) is a RuntimeError

log = logging.getLogger("frlab.rollout.remote.engine")


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


@dataclass(frozen=True)
class Snapshot:
    """The current weights on disk: what a server must load (and acknowledge) to be admitted."""

    path: Path
    version: int
    fingerprint: Mapping[str, Any]


class FleetMixin:
    """Server bookkeeping shared by RemoteEngine's request, sync and probe paths."""

    servers: list[Server]
    model: str | None
    request_timeout_s: float
    probe_interval_s: float
    fleet_down_timeout_s: float
    _last_healthy: float | None
    _syncing: bool
    _version: int
    _snapshot: Snapshot | None
    _counts: Counter[str]
    _client: httpx.AsyncClient | None
    _sync_lock: asyncio.Lock | None
    _user_paused: bool
    weight_update: str
    lora: dict[str, Any] | None

    def stats(self) -> dict[str, int]:
        """Counters and gauges for the pool's stats (logged as `rollout/<name>`)."""
        states = Counter(s.state for s in self.servers)
        return {
            "retries": self._counts["retries"],
            "servers_healthy": states["ok"],
            "servers_stale": states["stale"],
            "servers_dead": states["dead"] + states["unverified"],
            "stale_refusals": self._counts["stale_refusals"],
            "readmissions": self._counts["readmissions"],
            "server_faults": self._counts["faults"],
        }

    def down_reason(self) -> str | None:
        """Not None once no server has been healthy for `fleet_down_timeout_s` (outside a sync,
        whose waits have deadlines of their own)."""
        if self._last_healthy is None or self._syncing:
            return None
        if any(s.state == "ok" for s in self.servers):
            return None
        down_for = time.monotonic() - self._last_healthy
        if down_for < self.fleet_down_timeout_s:
            return None
        return (
            f"no server of rollout.remote.servers has been healthy for {down_for:.0f} s "
            f"(rollout.remote.fleet_down_timeout_s={self.fleet_down_timeout_s:g}): "
            f"{self._describe()}"
        )

    async def _watch_forever(self) -> None:
        """Note the time while any server is healthy (the clock of `down_reason`)."""
        while True:
            if any(s.state == "ok" for s in self.servers):
                self._last_healthy = time.monotonic()
            await asyncio.sleep(min(self.probe_interval_s, 1.0))

    def _describe(self) -> str:
        return ", ".join(
            f"{s.url}={s.state}@v{s.version}" + (f" ({s.why})" if s.why and s.state != "ok" else "")
            for s in self.servers
        )

    def _pick(self) -> Server | None:
        """The healthy server with the fewest requests in flight (first listed on ties)."""
        healthy = [s for s in self.servers if s.state == "ok"]
        return min(healthy, key=lambda s: s.in_flight) if healthy else None

    async def _post(
        self, server: Server, path: str, body: Any, timeout: float | None = None
    ) -> Any:
        """POST JSON and decode the answer; transport, 5xx and non-JSON raise ServerFault."""
        kw = {} if timeout is None else {"timeout": timeout}
        try:
            resp = await self._client.post(server.url + path, json=body, **kw)
        except httpx.TimeoutException as exc:
            raise ServerFault("dead", f"{path} timed out: {exc!r}") from exc
        except httpx.HTTPError as exc:
            raise ServerFault("dead", f"{path} transport error: {exc!r}") from exc
        return decode(resp, path)

    def _fault(self, server: Server, fault: ServerFault) -> None:
        self._counts["faults"] += 1
        self._counts["stale_refusals"] += fault.kind == "stale"
        if server.state == "ok":
            log.warning("remote engine: server %s marked %s: %s", server.url, fault.kind, fault)
        server.state, server.why = fault.kind, str(fault)
        server.labels = None if fault.kind == "dead" else server.labels  # a restart: re-probed

    # -- admission, probing ------------------------------------------------------------------
    async def _admit(self, server: Server) -> None:
        """Check the server's log-prob mode, load the current snapshot (if any) on it, then
        admit it only if it reports the current version; call with `_sync_lock` held."""
        was = server.state
        try:
            info = await self._server_info(server)
            mode = control.served_logprobs_mode(info)
            if mode != proto.PROCESSED_LOGPROBS:
                self._refuse(server, f"it serves logprobs_mode={mode!r}: run it with "
                             f"--logprobs-mode {proto.PROCESSED_LOGPROBS}")  # fmt: skip
                return
            if not self._serves_mode(server, control.served_weight_update(info)):
                return
            if server.stops and not await self._probe_labels(server):  # frlab...in_flight
                return
            snap = self._snapshot
            if self.lora is not None:  # the adapter's own name proves its version
                reported = [await self._adapters.load(server, snap)]
            elif snap is not None:
                args = [str(snap.path), snap.version, dict(snap.fingerprint)]  # 3rd: dedup key
                body = control.rpc_request(SNAPSHOT_METHOD, args)
                acks = control.rpc_dicts(
                    await self._post(server, proto.COLLECTIVE_RPC, body), "version"
                )
                check_acks(acks, snap.version, snap.fingerprint)
                if not (server.paused and self._generates(server)) and not control.reset_succeeded(
                    await self._post(server, proto.RESET_PREFIX_CACHE, {})
                ):
                    self._refuse(server, "its prefix-cache reset did not succeed")
                    return
            if self.lora is None:
                if not await self._set_label(server):
                    return
                answer = await self._post(
                    server, proto.COLLECTIVE_RPC, control.rpc_request(VERSION_METHOD)
                )
                reported = control.rpc_versions(answer)
            if server.paused and not self._syncing:  # a resubmit update could not resume it
                await self._resume(server)
        except ServerFault as fault:
            if was in ("ok", "unverified"):
                log.warning("remote engine: server %s marked %s: %s", server.url, fault.kind, fault)
            server.state, server.why = fault.kind, str(fault)
            server.labels = None if fault.kind == "dead" else server.labels  # re-probed
            return
        except REFUSED as exc:
            self._refuse(server, f"weight load not acknowledged: {exc}")
            return
        if any(v != self._version for v in reported):
            self._refuse(server, f"reports version(s) {reported}, expected {self._version}")
            return
        server.version, server.state, server.why = self._version, "ok", ""
        if was in ("dead", "stale"):
            self._counts["readmissions"] += 1
            log.warning("remote engine: server %s re-admitted: it reported version %d",
                        server.url, self._version)  # fmt: skip

    async def _server_info(self, server: Server) -> Any:
        """The server's `/server_info` answer, after learning its model id (once)."""
        if server.model is None:
            server.model = self.model or control.served_model(await self._get(server, proto.MODELS))
        # the first /server_info of a vLLM server collects its environment: allow time
        return await self._get(server, proto.SERVER_INFO, self.request_timeout_s)

    def _serves_mode(self, server: Server, served: str | None) -> bool:
        """Whether a server's own weight-update mode (frlab.serve reports it, vLLM does not)
        gives `in_flight` / `resubmit` what they ask (refused as stale otherwise)."""
        server.stops = served is None
        if served is not None and self.lora is not None:
            self._refuse(server, "frlab.serve loads full weights only: model.lora needs vLLM "
                         "servers run with --enable-lora")  # fmt: skip
            return False
        wanted = self.weight_update
        if served is None or wanted not in ("in_flight", "resubmit") or served == wanted:
            return True
        self._refuse(server, f"it runs --weight-update {served}; rollout.weight_update={wanted} "
                     f"needs frlab.serve --weight-update {wanted}")  # fmt: skip
        return False

    def _refuse(self, server: Server, why: str) -> None:
        self._counts["stale_refusals"] += 1
        server.state, server.why = "stale", why
        log.warning("remote engine: server %s refused as stale: %s", server.url, why)

    async def _get(self, server: Server, path: str, timeout: float | None = None) -> Any:
        try:
            resp = await self._client.get(
                server.url + path, timeout=timeout or min(5.0, self.request_timeout_s)
            )
        except httpx.HTTPError as exc:
            raise ServerFault("dead", f"GET {path}: {exc!r}") from exc
        return decode(resp, path)

    async def _healthy(self, server: Server) -> bool:
        """`GET /health` answered 200 (vLLM answers with an empty body: only the status counts)."""
        try:
            resp = await self._client.get(
                server.url + proto.HEALTH, timeout=min(5.0, self.request_timeout_s)
            )
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    async def _probe_forever(self) -> None:
        """Re-check dead / stale servers; admit none while the engine is paused (a collective sync
        of several ranks may be under way: admitting now could load an older snapshot)."""
        while True:
            await asyncio.sleep(self.probe_interval_s)
            for server in [s for s in self.servers if s.state != "ok"]:
                if not await self._healthy(server):
                    continue
                async with self._sync_lock:
                    if server.state != "ok" and not (self._user_paused or self._syncing):
                        await self._admit(server)


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
