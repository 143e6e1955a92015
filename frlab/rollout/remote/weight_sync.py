"""Weight sync of the `remote` engine (mixed into `frlab.rollout.remote.engine.RemoteEngine`).

Weight sync (`weight_sync="filesystem"`): `update_weights` writes
`<snapshot_dir>/v<version>/model.safetensors` (snapshot_dir None: a private temp folder,
removed at shutdown, for servers on this host) atomically (frlab.rollout.remote.snapshot), stops
dispatching, waits for in-flight requests to finish (`weight_update=drain`, the default: no
request spans a weight change; with `in_flight` they run on and each token's version comes
from the server's own labels, a vLLM server's requests frozen between two decode steps during
the load, frlab.rollout.remote.in_flight; with `resubmit` they are stopped and sent again
afterwards, frlab.rollout.remote.resubmit), asks
every live server to load it (`/collective_rpc frlab_load_snapshot`, acknowledged with a
fingerprint of the tensors loaded), then asks each server its version
(`frlab_weight_version`). A server that answers another version is stale: it is refused
(`stale_refusals`) until it proves the current version. Old snapshots are deleted (the newest
`keep_snapshots` stay). Token versions come from the server: `frlab_versions` in the answer
(frlab.serve), else the version that server reported at its last verification (vLLM).

Several learner ranks (DDP / FSDP) share one fleet: each rank has its own RemoteEngine on the
same servers (`shared_across_ranks`), `WeightSyncCallback` makes every sync collective (all
ranks hold, stop their requests as `weight_update` says, push, then resume, in the phases
`hold_for_update`, `stop_for_update`, `update_weights`, `release_update`:
frlab.rollout.remote.fleet_sync), the servers load each version
once and deduplicate the other ranks' identical pushes by (version, fingerprint), and each rank
writes its snapshots under `<snapshot_dir>/rank<R>` so no two ranks write one file. While the
engine is paused the prober admits nothing, so a rank never reloads an older snapshot over a
version another rank has just pushed.

Weight sync (`weight_sync="nccl"`, one learner rank only): after the same drain,
frlab.rollout.remote.nccl broadcasts through vLLM's own trainer engine, each server's workers
commit the version only if what they loaded matches the learner's fingerprint, then every
server is asked its version as above. Snapshots are written only if `snapshot_dir` is set:
they re-admit a server outside the NCCL group (restarted, refused) before the next sync
re-forms the group with it; without them it stays out until then. Tested with fake vllm
modules and fake servers on CPU; never run on GPUs with a real vLLM.

Admission (`_admit`, also how the prober re-admits a server): a server is `ok` only after it
reported `logprobs_mode=processed_logprobs` (`GET /server_info`, vLLM's dev mode) and the
fleet's current weight version in answer to `frlab_weight_version` (having first loaded and
acknowledged the current snapshot, if there is one, and reset its prefix cache with success);
`stale` when it reported another version or mode, did not acknowledge the load or the reset;
`dead` after a transport error, a timeout, an HTTP 5xx or a malformed answer; `unverified`
before its first check or during a sync. The prober re-checks the others every
`probe_interval_s` once `/health` answers 200. A frlab.serve server reports its own
weight-update mode in `/server_info`, which must be the fleet's `in_flight` / `resubmit` when
it asks one; a server without it (vLLM) is one a resubmit update pauses (`stops`), and one
left paused is resumed before it is re-admitted (frlab.rollout.remote.resubmit). Under
in_flight a vLLM server must also label tokens (probed at admission, its label set to the
current version before it is verified; its prefix cache is not reset while an update holds it
frozen: frlab.rollout.remote.in_flight). With LoRA the current adapter is loaded instead, and
its listing in `/v1/models` is the version proof (frlab.rollout.remote.lora).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from frlab.rollout.remote import control
from frlab.rollout.remote import protocol as proto
from frlab.rollout.remote.fleet import REFUSED, Fleet, Server, ServerFault, Snapshot
from frlab.rollout.remote.snapshot import prune_snapshots, write_snapshot
from frlab.rollout.remote.worker_extension import SNAPSHOT_METHOD, VERSION_METHOD, check_acks

log = logging.getLogger("frlab.rollout.remote.engine")


class WeightSyncMixin:
    """`update_weights` of the remote engine: snapshot, drain, load everywhere, verify; the
    admission of one server at the current weights, and the prober that re-admits."""

    _fleet: Fleet
    model: str | None
    snapshot_dir: Path | None
    keep_snapshots: int
    request_timeout_s: float
    _nccl: Any
    _version: int
    _snapshot: Snapshot | None
    _sync_lock: asyncio.Lock | None
    _idle: asyncio.Event | None
    _in_flight: int
    _syncing: bool
    _held: bool  # a collective update holds the engine (hold_for_update .. release_update)
    _user_paused: bool
    weight_update: str
    lora: dict[str, Any] | None

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Write the snapshot, drain, load it on every live server and verify their versions."""
        if int(version) < 0:
            raise ValueError(f"update_weights version must be >= 0, got {version}")
        snap = self._write(state_dict, int(version))
        self._call(self._sync(int(version), snap, self._push(state_dict, int(version))))
        if self.lora is not None:
            self._adapters.prune()
        elif self.snapshot_dir is not None:
            prune_snapshots(self.snapshot_dir, self.keep_snapshots)

    def _write(self, state_dict: Mapping[str, torch.Tensor], version: int) -> Snapshot | None:
        """The snapshot of `version` (None under nccl without a snapshot_dir; a LoRA fleet:
        the adapter folder, frlab.rollout.remote.lora)."""
        if self.lora is not None:
            return self._adapters.write(state_dict, version)
        if self.snapshot_dir is None:
            return None
        path, fingerprint = write_snapshot(state_dict, self.snapshot_dir, version)
        return Snapshot(path, version, fingerprint)

    def _push(self, state_dict: Mapping[str, torch.Tensor], version: int) -> Any:
        """The NCCL broadcast to run once drained (None for filesystem sync)."""
        if self._nccl is None:
            return None
        return functools.partial(self._nccl.push, self, list(state_dict.items()), version)

    async def _sync(self, version: int, snap: Snapshot | None, push: Any = None) -> None:
        """Hold, stop (as `weight_update` says), load, verify, release; a collective update
        (`hold_for_update` called) only loads and verifies: the caller stops and releases."""
        async with self._sync_lock:
            held = self._held
            if not held:
                self._hold()
            try:
                if not held:
                    await self._stop_in_flight()
                if push is not None:
                    await push()
                self._snapshot, self._version = snap, version
                live = [s for s in self._fleet.servers if s.state != "dead"]
                for s in self._fleet.servers:
                    s.state = "unverified" if s.state == "ok" else s.state
                await asyncio.gather(*(self._admit(s) for s in live))
                await self._abort_unverified()
            finally:
                if not held:
                    await self._release()
        log.info("remote engine: weights v%d on %s", version, self._fleet.describe())

    # -- the phases of an update (one rank: all in `_sync`; several: frlab...fleet_sync) -------
    def hold_for_update(self) -> None:
        """Phase 1 of a collective update: stop dispatching; a resubmit abort is ours from now."""
        self._call(self._hold_async())

    def stop_for_update(self) -> None:
        """Phase 2: the requests in flight drained, stopped or frozen (`weight_update`)."""
        self._call(self._stop_held())

    def release_update(self) -> None:
        """Last phase: resume the servers this rank paused, dispatch again."""
        self._call(self._release())

    async def _hold_async(self) -> None:
        self._hold()
        self._held = True

    def _hold(self) -> None:
        self._syncing = True
        self._refresh_gate()
        self._aborts += self.weight_update == "resubmit"  # aborted answers: ours (resubmit)

    async def _stop_held(self) -> None:
        async with self._sync_lock:  # an admission under way (prober) ends first
            pass
        await self._stop_in_flight()

    async def _stop_in_flight(self) -> None:
        if self.weight_update == "drain":
            await self._drain()
        elif self.weight_update == "resubmit":  # vLLM: stopped, sent again after
            await self._stop_requests()
        else:  # in_flight: requests run on, labelled (vLLM: frozen between steps)
            await self._freeze()

    async def _release(self) -> None:
        try:
            await self._resume_paused()
        finally:
            self._held = self._syncing = False
            self._refresh_gate()

    async def _drain(self) -> None:
        """Wait for in-flight requests (each ends within request_timeout_s: done or failed)."""
        try:
            await asyncio.wait_for(self._idle.wait(), self.request_timeout_s + 5.0)
        except TimeoutError:
            log.warning(
                "remote engine: %d requests still in flight at a weight sync", self._in_flight
            )

    # -- admission, probing ------------------------------------------------------------------
    async def _admit(self, server: Server) -> None:
        """Check the server's log-prob mode, load the current snapshot (if any) on it, then
        admit it only if it reports the current version; call with `_sync_lock` held."""
        fleet, was = self._fleet, server.state
        try:
            info = await self._server_info(server)
            mode = control.served_logprobs_mode(info)
            if mode != proto.PROCESSED_LOGPROBS:
                fleet.refuse(server, f"it serves logprobs_mode={mode!r}: run it with "
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
                    await fleet.post(server, proto.COLLECTIVE_RPC, body), "version"
                )
                check_acks(acks, snap.version, snap.fingerprint)
                if not (server.paused and self._generates(server)) and not control.reset_succeeded(
                    await fleet.post(server, proto.RESET_PREFIX_CACHE, {})
                ):
                    fleet.refuse(server, "its prefix-cache reset did not succeed")
                    return
            if self.lora is None:
                if not await self._set_label(server):
                    return
                answer = await fleet.post(
                    server, proto.COLLECTIVE_RPC, control.rpc_request(VERSION_METHOD)
                )
                reported = control.rpc_versions(answer)
            if server.paused and not self._syncing:  # a resubmit update could not resume it
                await self._resume(server)
        except ServerFault as fault:
            fleet.mark(server, fault, warn=was in ("ok", "unverified"))
            return
        except REFUSED as exc:
            fleet.refuse(server, f"weight load not acknowledged: {exc}")
            return
        if any(v != self._version for v in reported):
            fleet.refuse(server, f"reports version(s) {reported}, expected {self._version}")
            return
        fleet.admitted(server, self._version, was)

    async def _server_info(self, server: Server) -> Any:
        """The server's `/server_info` answer, after learning its model id (once)."""
        if server.model is None:
            server.model = self.model or control.served_model(
                await self._fleet.get(server, proto.MODELS)
            )
        # the first /server_info of a vLLM server collects its environment: allow time
        return await self._fleet.get(server, proto.SERVER_INFO, self.request_timeout_s)

    def _serves_mode(self, server: Server, served: str | None) -> bool:
        """Whether a server's own weight-update mode (frlab.serve reports it, vLLM does not)
        gives `in_flight` / `resubmit` what they ask (refused as stale otherwise)."""
        server.stops = served is None
        if served is not None and self.lora is not None:
            self._fleet.refuse(server, "frlab.serve loads full weights only: model.lora needs "
                               "vLLM servers run with --enable-lora")  # fmt: skip
            return False
        wanted = self.weight_update
        if served is None or wanted not in ("in_flight", "resubmit") or served == wanted:
            return True
        self._fleet.refuse(server, f"it runs --weight-update {served}; rollout.weight_update="
                           f"{wanted} needs frlab.serve --weight-update {wanted}")  # fmt: skip
        return False

    async def _probe_forever(self) -> None:
        """Re-check dead / stale servers; admit none while the engine is paused (a collective sync
        of several ranks may be under way: admitting now could load an older snapshot)."""
        while True:
            await asyncio.sleep(self._fleet.probe_interval_s)
            for server in [s for s in self._fleet.servers if s.state != "ok"]:
                if not await self._fleet.healthy(server):
                    continue
                async with self._sync_lock:
                    if server.state != "ok" and not (self._user_paused or self._syncing):
                        await self._admit(server)
