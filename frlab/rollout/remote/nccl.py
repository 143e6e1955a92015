"""NCCL weight sync of the `remote` engine (`rollout.remote.weight_sync=nccl`) via vLLM's own
trainer-side weight-transfer engine.

The learner process (one rank only) is NCCL rank 0; each server's workers follow, server i at
`rank_offset` 1 + the worker counts of servers 0..i-1 (`GET /get_world_size`). vLLM's
`WeightTransferTrainerFactory.trainer_init(NCCLTrainerInitInfo(...), client=..., source=...)`
opens the group and `send_weights()` runs one round (start, update concurrent with the
broadcast, finish); `FleetClient` is the `VLLMWeightSyncClient` it drives, fanning each call
out to every member at once. vLLM's trainer API (imported only when nccl is chosen) and the
weight source it sends from are frlab.rollout.vllm.nccl.

Verification (frlab.rollout.vllm.worker_extension): after forming a group every member joins it by
token; before each broadcast `frlab_nccl_begin(token)` must answer True on every member (a
restarted server does not know the token) and taps the workers' `load_weights`; after it
`frlab_commit_version(version, fingerprint)` commits only what matches the learner's
fingerprint. The engine then asks each server its version as the filesystem path does.

Group changes: a group whose member is dead, restarted (it does not know the token) or fails
a call is retired, and so is one that leaves out a server that answers again (down at
formation, or restarted); the next sync forms a new group from every server that reports its
worker count (`nccl_master_port` + generation, or a fresh free port when it is 0), so a
restarted server rejoins at the next sync. Until then, or if no group can be formed or the
broadcast fails (no server commits), a server outside the group loads the latest snapshot if
`snapshot_dir` is set (snapshots are then written at every sync), else it stays out as stale.
Every server must run vLLM with `--weight-transfer-config '{"backend": "nccl"}'` and dev mode:
one that answers `/get_world_size` but cannot init the transfer fails every formation. The
servers reach the learner at `rollout.remote.nccl_master_address` (required when a server is
on another host: frlab.rollout.remote.hosts), loopback otherwise. The worker rpcs answer dicts
(`{"group"}`, `{"ready"}`, an ack) because vLLM's HTTP router stringifies other results.

The `vllm_contract` tests build vLLM's real `NCCLTrainerInitInfo` with frlab's arguments and
parse the bodies the trainer engine sends with vLLM's own worker-side info classes; the
broadcast itself has not run (it needs GPUs). A member that dies DURING a broadcast can hang
NCCL in the learner (vLLM's send has no timeout): the HTTP calls time out, the broadcast
thread may not.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import torch

from frlab.errors import ConfigError
from frlab.rollout.engine import EngineError
from frlab.rollout.remote import control
from frlab.rollout.remote import protocol as proto
from frlab.rollout.remote.auth import FleetAuthError
from frlab.rollout.remote.fleet import REFUSED, Fleet, Server, ServerFault
from frlab.rollout.remote.hosts import nccl_master_address
from frlab.rollout.vllm.nccl import TrainerApi, build_source, load_trainer_api
from frlab.rollout.vllm.worker_extension import (
    COMMIT_METHOD,
    NCCL_BEGIN_METHOD,
    NCCL_JOIN_METHOD,
    check_acks,
    weights_fingerprint,
)

log = logging.getLogger("frlab.rollout.remote.engine")


def check_nccl_settings(master_address: str | None, master_port: int, packed: bool) -> None:
    """ValueError naming the `rollout.remote.nccl_*` key of the first invalid setting."""
    if master_address is not None and (not isinstance(master_address, str) or not master_address):
        raise ConfigError(
            "rollout.remote.nccl_master_address",
            f"must be a host name or null, got {master_address!r}",
        )
    if isinstance(master_port, bool) or not isinstance(master_port, int):
        raise ConfigError("rollout.remote.nccl_master_port", f"must be an int, got {master_port!r}")
    if not 0 <= master_port <= 65535:
        raise ConfigError(
            "rollout.remote.nccl_master_port", f"must be in [0, 65535], got {master_port}"
        )
    if not isinstance(packed, bool):
        raise ConfigError("rollout.remote.nccl_packed", f"must be true|false, got {packed!r}")


class FleetClient:
    """vLLM's `VLLMWeightSyncClient` protocol over every member of the NCCL group: each call
    goes to all members at once (their workers meet in the same NCCL calls) and raises
    EngineError if any fails; init gives each server its own `rank_offset`."""

    def __init__(
        self,
        urls: Sequence[str],
        offsets: Sequence[int],
        timeout: float,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.urls, self.offsets, self.timeout = list(urls), list(offsets), float(timeout)
        self.headers = dict(headers or {})  # the fleet's bearer token
        self.weight_version: str | None = None

    def _fan_out(self, path: str, bodies: Sequence[dict[str, Any]]) -> None:
        errors = []
        with (
            httpx.Client(timeout=self.timeout, trust_env=False, headers=self.headers) as http,
            ThreadPoolExecutor(len(self.urls)) as pool,
        ):
            futures = [
                pool.submit(http.post, u + path, json=b)
                for u, b in zip(self.urls, bodies, strict=True)
            ]
            for url, future in zip(self.urls, futures, strict=True):
                try:
                    if future.result().status_code == 401:
                        raise FleetAuthError(url)
                    future.result().raise_for_status()
                except FleetAuthError:
                    raise
                except Exception as exc:  # every failure is reported together
                    errors.append(f"{url}: {exc!r}")
        if errors:
            raise EngineError(f"NCCL weight transfer {path} failed on {'; '.join(errors)}")

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._fan_out(
            proto.INIT_WEIGHT_TRANSFER,
            [{"init_info": {**init_info, "rank_offset": off}} for off in self.offsets],
        )

    def start_weight_update(self) -> None:
        self._fan_out(proto.START_WEIGHT_UPDATE, [{}] * len(self.urls))

    def update_weights(self, update_info: Any) -> None:
        self._fan_out(proto.UPDATE_WEIGHTS, [{"update_info": update_info}] * len(self.urls))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        version = weight_version if weight_version is not None else self.weight_version
        body = {} if version is None else {"weight_version": version}
        self._fan_out(proto.FINISH_WEIGHT_UPDATE, [body] * len(self.urls))


def free_port(host: str = "") -> int:
    """A TCP port free on `host` (the interface the rendezvous listens on) right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class NcclSync:
    """One learner's NCCL group with the fleet: formed, verified, re-formed when broken."""

    def __init__(
        self,
        master_address: str | None,
        master_port: int,
        packed: bool,
        timeout: float,
        servers: Sequence[str] = (),
    ) -> None:
        check_nccl_settings(master_address, master_port, packed)
        self.master_address = nccl_master_address(master_address, servers)
        self.master_port = int(master_port)
        self.packed, self.timeout = bool(packed), float(timeout)
        self.api: TrainerApi | None = None
        self.trainer: Any = None
        self.source: Any = None
        self.members: list[Server] = []
        self.token, self.generation = "", 0

    def load(self) -> None:
        """At engine start: one learner rank only, and vLLM's trainer API (else EngineError)."""
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise EngineError(
                "rollout.remote.weight_sync=nccl supports one learner rank (the single NCCL "
                f"sender), this run has {dist.get_world_size()}; use weight_sync=filesystem"
            )
        self.api = load_trainer_api()
        self.source = build_source(self.api)

    async def push(
        self,
        fleet: Fleet,
        frozen: Callable[[Server], bool],
        named: list[tuple[str, torch.Tensor]],
        version: int,
    ) -> None:
        """Broadcast `named` to the group and commit `version` on the members that loaded
        exactly it (`frozen(server)`: an in_flight update holds its requests, so its prefix
        cache is not reset); the caller then verifies every server's version."""
        members = await self._ready(fleet)
        if not members:
            return
        fingerprint = weights_fingerprint(named)
        self.source.set(named)
        self.trainer.client.weight_version = str(version)
        try:
            send = asyncio.to_thread(self.trainer.send_weights)
            await asyncio.wait_for(send, 4 * self.timeout)  # start, update, finish: each timed
        except Exception as exc:  # the group is unusable: no member commits
            log.error("remote engine: NCCL broadcast of v%d failed: %r", version, exc)
            self._retire()
            return
        finally:
            self.source.set([])
        body = control.rpc_request(COMMIT_METHOD, [int(version), dict(fingerprint)])
        await asyncio.gather(
            *(self._commit(fleet, frozen, s, body, version, fingerprint) for s in members)
        )

    async def _commit(
        self,
        fleet: Fleet,
        frozen: Callable[[Server], bool],
        server: Server,
        body: Any,
        version: int,
        fingerprint: Any,
    ) -> None:
        try:
            answer = await fleet.post(server, proto.COLLECTIVE_RPC, body)
            check_acks(control.rpc_dicts(answer, "version"), version, fingerprint)
            if frozen(server):  # in_flight: frozen requests
                return  # hold KV blocks, so vLLM's reset would fail (frlab...in_flight)
            # no KV computed by the old weights
            reset = await fleet.post(server, proto.RESET_PREFIX_CACHE, {})
            if not control.reset_succeeded(reset):
                raise RuntimeError("its prefix-cache reset did not succeed")
        except ServerFault as fault:
            server.state = fault.kind
        except REFUSED as exc:  # refused by the version check (the version check follows)
            log.warning(
                "remote engine: %s did not commit NCCL weights v%d: %s", server.url, version, exc
            )

    async def _ready(self, fleet: Fleet) -> list[Server]:
        """The group's members after `frlab_nccl_begin` succeeded on all; re-forms once."""
        inside = {s.url for s in self.members}
        if self.trainer is not None and any(
            s.url not in inside and s.state != "dead" for s in fleet.servers
        ):  # a server that answers is outside the group (restarted, or late): re-form
            self._retire()
        for _ in range(2):
            if self.trainer is None and not await self._form(fleet):
                return []
            if await self._begin(fleet):
                return self.members
            self._retire()
        return []

    async def _begin(self, fleet: Fleet) -> bool:
        if any(s.state == "dead" for s in self.members):
            return False
        body = control.rpc_request(NCCL_BEGIN_METHOD, [self.token])
        ready = (self._rpc_ok(fleet, s, body, self._ready_flags) for s in self.members)
        return all(await asyncio.gather(*ready))

    def _ready_flags(self, answer: Any) -> bool:
        return all(control.rpc_flags(answer, "ready"))

    def _joined(self, answer: Any) -> bool:
        return all(r["group"] == self.token for r in control.rpc_dicts(answer, "group"))

    async def _rpc_ok(self, fleet: Fleet, server: Server, body: Any, check: Any) -> bool:
        """True when `server` answered the rpc and `check(answer)` holds for it."""
        try:
            return bool(check(await fleet.post(server, proto.COLLECTIVE_RPC, body)))
        except ServerFault as fault:
            server.state = fault.kind
        except REFUSED as exc:
            log.warning("remote engine: %s refused an NCCL group rpc: %s", server.url, exc)
        return False

    async def _form(self, fleet: Fleet) -> bool:
        """Open a group with every server that reports its worker count; join it by token."""
        sized = await asyncio.gather(*(self._workers(fleet, s) for s in fleet.servers))
        members = [s for s, n in zip(fleet.servers, sized, strict=True) if n]
        if not members:
            return False
        offsets, world = control.nccl_rank_offsets([n for n in sized if n])
        port = (
            self.master_port + self.generation
            if self.master_port
            else free_port(self.master_address)
        )
        self.generation += 1
        client = FleetClient([s.url for s in members], offsets, self.timeout, fleet.headers)
        info = self.api.init_info_cls(
            master_address=self.master_address,
            master_port=port,
            world_size=world,
            packed=self.packed,
            rank=0,
        )
        try:
            self.trainer = await asyncio.wait_for(
                asyncio.to_thread(
                    self.api.factory.trainer_init, info, client=client, source=self.source
                ),
                2 * self.timeout,
            )
        except FleetAuthError as exc:  # a member refused the secret: no retry mends it
            fleet.auth_error = fleet.auth_error or exc
            raise
        except Exception as exc:
            log.error("remote engine: forming the NCCL group on port %d failed: %r", port, exc)
            return False
        self.members, self.token = members, f"{uuid.uuid4().hex}-{self.generation}"
        log.info(
            "remote engine: NCCL group of %d ranks on %s:%d: %s",
            world,
            info.master_address,
            port,
            [s.url for s in members],
        )
        body = control.rpc_request(NCCL_JOIN_METHOD, [self.token])
        if all(
            await asyncio.gather(*(self._rpc_ok(fleet, s, body, self._joined) for s in members))
        ):
            return True
        self._retire()
        return False

    async def _workers(self, fleet: Fleet, server: Server) -> int:
        """The server's worker count (0 when it does not answer: not a member)."""
        try:
            return control.world_size_of(await fleet.get(server, proto.WORLD_SIZE))
        except ServerFault as fault:
            server.state = fault.kind
        except (RuntimeError, proto.MalformedResponse) as exc:  # EngineError: a 4xx answer
            log.warning(
                "remote engine: %s left out of the NCCL group (vLLM needs "
                "VLLM_SERVER_DEV_MODE=1): %s",
                server.url,
                exc,
            )
        return 0

    def _retire(self) -> None:
        """Drop the current group (its members must join a new one)."""
        if self.trainer is not None:
            try:
                self.trainer.shutdown()
            except Exception:  # tearing down a broken group must not fail the sync
                log.exception("remote engine: closing the NCCL group failed")
            log.warning("remote engine: NCCL group retired; the next sync forms a new one")
        self.trainer, self.members, self.token = None, [], ""

    def shutdown(self) -> None:
        self._retire()
