"""Weight sync of the `remote` engine: `WeightSync`, held by `RemoteEngine`.

Weight sync (`weight_sync="filesystem"`): `update_weights` writes
`<snapshot_dir>/v<version>/model.safetensors` (snapshot_dir None: a private temp folder,
removed at shutdown, for servers on this host) atomically (frlab.rollout.vllm.snapshot), stops
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
frlab.rollout.callbacks.push_collectively), the servers load each version
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

Admission (`admit`, also how the prober re-admits a server): a server is `ok` only after it
reported `logprobs_mode=processed_logprobs` (`GET /server_info`, vLLM's dev mode) and the
fleet's current weight version in answer to `frlab_weight_version` (having first loaded and
acknowledged the current snapshot, if there is one, and reset its prefix cache with success);
`stale` when it reported another version or mode, did not acknowledge the load or the reset;
`dead` after a transport error, a timeout, an HTTP 5xx or a malformed answer; `unverified`
before its first check or during a sync. A server that a request marks dead or stale while it
is being admitted stays so (the admission's checks came before that fault, and a dead mark
forgets whether it labels tokens). Each server's watcher (frlab.rollout.remote.breaker)
re-checks a server that is not `ok` on a backoff (`probe`), once `/health` answers 200. A
frlab.serve server reports its own
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
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from frlab.rollout.engine import EngineError
from frlab.rollout.remote import control, in_flight, resubmit
from frlab.rollout.remote import protocol as proto
from frlab.rollout.remote.fleet import REFUSED, Fleet, Server, ServerFault, Snapshot
from frlab.rollout.remote.lora import LoraAdapters
from frlab.rollout.remote.traffic import Traffic
from frlab.rollout.vllm.snapshot import prune_snapshots, write_snapshot
from frlab.rollout.vllm.worker_extension import SNAPSHOT_METHOD, VERSION_METHOD, check_acks

log = logging.getLogger("frlab.rollout.remote.engine")


def rank_folder(snapshot_dir: str | Path) -> Path:
    """`snapshot_dir`, or `<snapshot_dir>/rank<R>` when this process is rank R of W > 1 (the
    ranks that share one fleet never write one file)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return Path(snapshot_dir) / f"rank{dist.get_rank()}"
    return Path(snapshot_dir)


def snapshot_folder(snapshot_dir: str | None, *, own: bool) -> Path | None:
    """Where this rank writes snapshots: a private temp folder (`own`), else its rank folder."""
    if own:
        return Path(tempfile.mkdtemp(prefix="frlab-snapshots-"))
    return None if snapshot_dir is None else rank_folder(snapshot_dir)


class WeightSync:
    """The fleet's weight version: snapshot, stop the requests as `mode` says, load everywhere,
    verify, release; the admission of one server at the current weights, and the prober that
    re-admits. The async methods run on the engine's event loop."""

    def __init__(
        self,
        fleet: Fleet,
        traffic: Traffic,
        *,
        mode: str | None,
        version: int,
        model: str | None,
        snapshot_dir: Path | None,
        keep_snapshots: int,
        nccl: Any,
        adapters: LoraAdapters | None,
    ) -> None:
        self.fleet, self.traffic = fleet, traffic
        self.mode = mode  # rollout.weight_update (None until the engine's start picks one)
        self.version = int(version)
        self.snapshot: Snapshot | None = None
        self.lock: asyncio.Lock | None = None  # one sync or admission at a time
        self.model, self.snapshot_dir, self.keep_snapshots = model, snapshot_dir, keep_snapshots
        self.nccl, self.adapters = nccl, adapters

    # -- an update ---------------------------------------------------------------------------
    def write(self, state_dict: Mapping[str, torch.Tensor], version: int) -> Snapshot | None:
        """The snapshot of `version` (None under nccl without a snapshot_dir; a LoRA fleet:
        the adapter folder, frlab.rollout.remote.lora)."""
        if self.adapters is not None:
            return self.adapters.write(state_dict, version)
        if self.snapshot_dir is None:
            return None
        path, fingerprint = write_snapshot(state_dict, self.snapshot_dir, version)
        return Snapshot(path, version, fingerprint)

    def push(self, state_dict: Mapping[str, torch.Tensor], version: int) -> Any:
        """The NCCL broadcast to run once the requests are stopped (None for filesystem)."""
        if self.nccl is None:
            return None
        named = list(state_dict.items())
        return functools.partial(self.nccl.push, self.fleet, self.frozen, named, version)

    def prune(self) -> None:
        """Delete old snapshots (the newest `keep_snapshots` stay)."""
        if self.adapters is not None:
            self.adapters.prune()
        elif self.snapshot_dir is not None:
            prune_snapshots(self.snapshot_dir, self.keep_snapshots)

    def frozen(self, server: Server) -> bool:
        """An in_flight update holds this server's requests frozen (their KV blocks held, so
        its prefix cache is not reset)."""
        return server.paused and in_flight.generates(server, self.mode)

    async def sync(self, version: int, snap: Snapshot | None, push: Any = None) -> None:
        """Hold, stop (as `mode` says), load, verify, release; a collective update
        (`hold` called) only loads and verifies: the caller stops and releases."""
        async with self.lock:
            held = self.traffic.held
            if not held:
                self._hold()
            try:
                if not held:
                    await self._stop_in_flight()
                if push is not None:
                    await push()
                self.snapshot, self.version = snap, version
                live = [s for s in self.fleet.servers if s.state != "dead"]
                for s in self.fleet.servers:
                    s.state = "unverified" if s.state == "ok" else s.state
                await asyncio.gather(*(self.fleet.while_up(s, self.admit(s)) for s in live))
                await in_flight.abort_unverified(self.fleet, self.mode)
            finally:
                if not held:
                    await self.release()
        log.info("remote engine: weights v%d on %s", version, self.fleet.describe())

    # -- the phases of a collective update (frlab.rollout.callbacks.push_collectively) -------
    async def hold(self) -> None:
        """Phase 1: stop dispatching; a resubmit abort is ours from now."""
        self._hold()
        self.traffic.held = True

    def _hold(self) -> None:
        self.traffic.syncing = True
        self.traffic.refresh()
        self.traffic.aborts += self.mode == "resubmit"  # aborted answers: ours (resubmit)

    async def stop_held(self) -> None:
        """Phase 2: the requests in flight drained, stopped or frozen (`mode`)."""
        async with self.lock:  # an admission under way (prober) ends first
            pass
        await self._stop_in_flight()

    async def _stop_in_flight(self) -> None:
        if self.mode == "drain":
            await self.traffic.drain()
        elif self.mode == "resubmit":  # vLLM: stopped, sent again after
            await resubmit.stop_requests(self.fleet)
        else:  # in_flight: requests run on, labelled (vLLM: frozen between steps)
            await in_flight.freeze(self.fleet, self.mode)

    async def release(self) -> None:
        """Last phase: resume the servers this update paused, dispatch again."""
        try:
            await self.fleet.resume_paused()
        finally:
            self.traffic.held = self.traffic.syncing = False
            self.traffic.refresh()

    # -- admission, probing ------------------------------------------------------------------
    async def admit_at_start(self, push: Any, deadline_s: float) -> None:
        """Until a server serves the current version (EngineError after `deadline_s`): nccl
        broadcasts to the servers that answer by now, filesystem admits each server."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + deadline_s
        while True:
            if push is not None:
                await self.sync(self.version, self.snapshot, push)
            else:
                async with self.lock:
                    await asyncio.gather(
                        *(self.admit(s) for s in self.fleet.servers if s.state != "ok")
                    )
            if self.fleet.healthy_now():
                return
            if loop.time() > deadline:
                raise EngineError(
                    f"no server in rollout.remote.servers serves weight version {self.version} "
                    f"after {deadline_s}s: {self.fleet.describe()}"
                )
            await asyncio.sleep(min(0.2, self.fleet.probe_interval_s))

    async def admit(self, server: Server) -> None:
        """Check the server's log-prob mode, load the current snapshot (if any) on it, then
        admit it only if it reports the current version; call with `lock` held."""
        fleet, was, marks = self.fleet, server.state, server.marks
        try:
            info = await fleet.server_info(server, self.model)
            mode = control.served_logprobs_mode(info)
            if mode != proto.PROCESSED_LOGPROBS:
                fleet.refuse(
                    server,
                    f"it serves logprobs_mode={mode!r}: run it with "
                    f"--logprobs-mode {proto.PROCESSED_LOGPROBS}",
                )
                return
            if not self._serves_mode(server, control.served_weight_update(info)):
                return
            syncing = lambda: self.traffic.syncing  # noqa: E731  (read when the probe resumes)
            if server.stops and not await in_flight.probe_labels(fleet, server, self.mode, syncing):
                return
            reported = await self._load(server)
            if reported is None:
                return
            if server.paused and not self.traffic.syncing:  # an update could not resume it
                await fleet.resume(server)
        except ServerFault as fault:
            fleet.mark(server, fault, warn=was in ("ok", "unverified"))
            return
        except REFUSED as exc:
            fleet.refuse(server, f"weight load not acknowledged: {exc}")
            return
        if any(v != self.version for v in reported):
            fleet.refuse(server, f"reports version(s) {reported}, expected {self.version}")
            return
        if server.marks != marks:  # a request failed on it meanwhile: the prober re-checks it
            return
        fleet.admitted(server, self.version, was)

    async def _load(self, server: Server) -> list[int] | None:
        """Load the current snapshot (or adapter) on `server` and return the version(s) it
        reports (None: refused)."""
        fleet, snap = self.fleet, self.snapshot
        if self.adapters is not None:  # the adapter's own name proves its version
            return [await self.adapters.load(server, snap)]
        if snap is not None:
            args = [str(snap.path), snap.version, dict(snap.fingerprint)]  # 3rd: dedup key
            body = control.rpc_request(SNAPSHOT_METHOD, args)
            acks = control.rpc_dicts(
                await fleet.post(server, proto.COLLECTIVE_RPC, body), "version"
            )
            check_acks(acks, snap.version, snap.fingerprint)
            if not self.frozen(server) and not control.reset_succeeded(
                await fleet.post(server, proto.RESET_PREFIX_CACHE, {})
            ):
                fleet.refuse(server, "its prefix-cache reset did not succeed")
                return None
        if not await in_flight.set_label(fleet, server, self.version, self.mode):
            return None
        answer = await fleet.post(server, proto.COLLECTIVE_RPC, control.rpc_request(VERSION_METHOD))
        return control.rpc_versions(answer)

    def _serves_mode(self, server: Server, served: str | None) -> bool:
        """Whether a server's own weight-update mode (frlab.serve reports it, vLLM does not)
        gives `in_flight` / `resubmit` what they ask (refused as stale otherwise)."""
        server.stops = served is None
        if served is not None and self.adapters is not None:
            self.fleet.refuse(
                server,
                "frlab.serve loads full weights only: model.lora needs "
                "vLLM servers run with --enable-lora",
            )
            return False
        wanted = self.mode
        if served is None or wanted not in ("in_flight", "resubmit") or served == wanted:
            return True
        self.fleet.refuse(
            server,
            f"it runs --weight-update {served}; rollout.weight_update="
            f"{wanted} needs frlab.serve --weight-update {wanted}",
        )
        return False

    async def probe(self, server: Server) -> bool | None:
        """Probe a server that is not ok (frlab.rollout.remote.breaker): `/health`, then its
        admission. True: admitted; False: it failed; None: not tried, as while the engine is
        paused or an update holds the fleet (a collective sync of several ranks may be under
        way: admitting now could load an older snapshot)."""
        if self.traffic.user_paused or self.traffic.syncing:
            return None
        if not await self.fleet.healthy(server):
            return False
        async with self.lock:
            if server.state == "ok":
                return True
            if self.traffic.user_paused or self.traffic.syncing:
                return None
            await self.admit(server)
        return server.state == "ok"
