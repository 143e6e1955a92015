"""`remote` engine: the rollout pool drives a fleet of generation servers over HTTP.

On GPUs the servers are vLLM's own OpenAI-compatible servers (`vllm serve ...
--worker-extension-cls frlab.rollout.vllm.worker_extension.WeightUpdateExtension`, dev mode on); on
CPU
and in tests they are `python -m frlab.serve` processes (a test vehicle, not vLLM). Token in,
token out: `frlab.rollout.remote.protocol` shapes every request and checks every answer.

Load spreading: each request goes to the healthy server with the fewest requests in flight.
Failover: a connection error, a timeout (`request_timeout_s`: a hung server), an HTTP 5xx or
a malformed answer marks the server dead (logged once per outage of that server) and the
request is retried on another server (`retries` counter); a server whose liveness probe fails
is marked dead too, and its requests in flight fail over at once. An HTTP 4xx is our own bad
request and fails at once (`EngineError`: it costs the rollout). After `max_retries` retries
(waiting `probe_interval_s` while no server is healthy) `generate` raises `EngineFault`: the
fleet's fault, so the pool requeues the prompt. While no server is healthy (`outage`) the
engine sends no request and the pool admits no rollout (frlab.rollout.remote.breaker); a
fleet with no healthy server for `fleet_down_timeout_s` is down for good (`down_reason`,
naming every server and its last error): the pool stops the run with `EngineDown`. Each
server's watcher probes it on a backoff while it is down; one that answers `/health` again must
load the current snapshot and report the current weight version before it is re-admitted.

The engine holds three parts: the servers' states, load spreading, HTTP and control calls
(`Fleet`, frlab.rollout.remote.fleet); its own requests' gate and in-flight count (`Traffic`,
frlab.rollout.remote.traffic); and the weight sync (`WeightSync`, frlab.rollout.remote.
weight_sync: filesystem snapshots or vLLM's NCCL broadcast, the version check, several learner
ranks sharing one fleet, the admission and re-probing of a server). What `weight_update` (drain
| in_flight | resubmit) does to requests in flight is in frlab.rollout.remote.resubmit and
frlab.rollout.remote.in_flight. Token versions come from the server: `frlab_versions` in the
answer (frlab.serve); under in_flight on vLLM, the per-token `weight_versions` spans of its
token-in/token-out endpoint (`/inference/v1/generate`, vLLM 0.32+ with `--enable-scale-out`:
probed once per server, frlab.rollout.remote.in_flight and frlab.rollout.remote.generate); under
drain and resubmit on vLLM (`/v1/completions`, no labels), the version that server reported at
its last verification. So in_flight is exact on frlab.serve and on vLLM servers that label
tokens; a vLLM server that does not is refused under in_flight, naming rollout.weight_update.
With a LoRA policy (`model.lora`) the servers serve the base model and each update sends the
adapter only, loaded by vLLM under the version's own name (frlab.rollout.remote.lora).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from frlab.errors import ConfigError
from frlab.rollout.engine import (
    Engine,
    EngineError,
    EngineFault,
    GenerationResult,
    Outage,
    SamplingParams,
    request_seed,
    resolve_weight_update,
)
from frlab.rollout.engine_loop import EngineLoop
from frlab.rollout.remote import auth, breaker, in_flight, limits, resubmit
from frlab.rollout.remote import generate as gen
from frlab.rollout.remote import protocol as proto
from frlab.rollout.remote.fleet import Fleet, Server, ServerFault, check_urls
from frlab.rollout.remote.lora import LORA_WEIGHT_UPDATES, LoraAdapters, check_lora_settings
from frlab.rollout.remote.nccl import NcclSync
from frlab.rollout.remote.traffic import Traffic
from frlab.rollout.remote.weight_sync import WeightSync, snapshot_folder
from frlab.rollout.vllm.args import check_user_engine_args
from frlab.rollout.weight_modes import Fragment, continue_after_abort

log = logging.getLogger(__name__)


class RemoteEngine(Engine):
    """Generation on a fleet of HTTP servers, with versioned weight sync and failover."""

    shared_across_ranks = True  # every learner rank drives the same servers: collective syncs
    serves_lora = True  # vLLM servers with runtime LoRA loading (frlab.rollout.remote.lora)
    reads_fleet = True

    @classmethod
    def check_settings(cls, rollout: Mapping[str, Any], world: int) -> None:
        """The `rollout.remote` block: present, distinct http(s) servers; nccl weight sync has
        one sender, so one learner rank, and an address the servers reach (filesystem sync
        serves any number of ranks: they share the fleet, each writing `<snapshot_dir>/rank<R>`)."""
        from frlab.rollout.remote.hosts import nccl_master_address

        remote = rollout.get("remote")
        if remote is None:
            raise ConfigError("rollout.remote", "missing: select the backend with rollout=remote")
        if not isinstance(remote, Mapping):
            raise ConfigError("rollout.remote", f"must be a mapping, got {remote!r}")
        check_urls(remote["servers"])
        if remote["weight_sync"] == "nccl" and world > 1:
            raise ConfigError(
                "rollout.remote.weight_sync",
                f"nccl supports one learner rank (the single NCCL "
                f"sender), this run has {world}; use filesystem with several ranks",
            )
        if remote["weight_sync"] == "nccl":
            nccl_master_address(remote.get("nccl_master_address"), remote["servers"])
        auth.fleet_secret(
            remote["servers"],
            remote.get("secret_env"),
            remote.get("secret_file"),
            bool(remote.get("allow_unauthenticated")),
        )
        check_user_engine_args(rollout.get("vllm_engine_args") or {})  # the fleet recipes' presets

    @classmethod
    def for_policy(
        cls, policy: Any, *, seed: int, settings: Mapping[str, Any], weight_update: str | None
    ) -> RemoteEngine:
        """The engine of `rollout=remote`: the fleet of `settings` (the `rollout.remote`
        block), starting from the learner's `policy` weights (a LoRA policy: its adapter, on
        servers that serve its base)."""
        from frlab.model.lora import adapter_state_dict, is_peft
        from frlab.rollout.vllm.lora import adapter_config

        lora = adapter_config(policy) if is_peft(policy) else None
        weights = policy.state_dict()
        return cls(
            **settings,
            seed=seed,
            weight_update=weight_update,
            lora=lora,
            initial_weights=weights if lora is None else adapter_state_dict(weights),
            vocab_size=limits.model_vocab_size(policy),
        )

    @classmethod
    def lora_weight_updates(cls) -> tuple[str, ...]:
        """The modes exact with a LoRA policy (frlab.rollout.remote.lora)."""
        return LORA_WEIGHT_UPDATES

    @classmethod
    def weight_updates(cls) -> tuple[str, ...]:
        """drain (exact with every server); in_flight where the servers label each token with
        its version (frlab.serve; vLLM 0.32+ with --enable-scale-out; a server without labels
        is refused), the default (null) when every server does at start; resubmit on vLLM
        (pause-abort, resume) and frlab.serve."""
        return ("drain", "in_flight", "resubmit")

    def __init__(
        self,
        *,
        servers: Sequence[str],
        snapshot_dir: str | None,
        weight_sync: str,
        request_timeout_s: float,
        max_retries: int,
        probe_interval_s: float,
        probe_backoff_max_s: float,
        startup_timeout_s: float,
        fleet_down_timeout_s: float,
        keep_snapshots: int,
        model: str | None,
        nccl_master_address: str | None,
        nccl_master_port: int,
        nccl_packed: bool,
        secret_env: str,
        secret_file: str | None,
        allow_unauthenticated: bool,
        seed: int,
        weight_update: str | None,
        initial_version: int = 0,
        initial_weights: Mapping[str, torch.Tensor] | None = None,
        lora: Mapping[str, Any] | None = None,
        vocab_size: int | None = None,
    ) -> None:
        """The fleet's settings are the `rollout.remote` keys (frlab.config.schema.RemoteConfig,
        their one declaration, checked there) and `seed` / `weight_update` the run's; the rest
        is the learner's state at start (its weights, its LoRA adapter, the vocabulary)."""
        urls = check_urls(servers)
        mode = resolve_weight_update(weight_update, self.weight_updates(), "remote")
        self._auto_mode = weight_update is None  # chosen at start (in_flight where exact)
        check_lora_settings(lora, mode, weight_sync)
        self.lora = None if lora is None else dict(lora)  # the adapter's peft config
        self._nccl = (
            NcclSync(nccl_master_address, nccl_master_port, nccl_packed, request_timeout_s, urls)
            if weight_sync == "nccl"
            else None
        )
        secret = auth.fleet_secret(urls, secret_env, secret_file, allow_unauthenticated)
        self._unauthenticated = secret is None and not auth.all_loopback(urls)
        self._fleet = Fleet(
            urls,
            request_timeout_s,
            probe_interval_s,
            fleet_down_timeout_s,
            headers=auth.bearer_headers(secret),
            probe_backoff_max_s=probe_backoff_max_s,
        )
        self.vocab_size = None if vocab_size is None else int(vocab_size)  # ids answers may hold
        # a private temp folder for servers on this host only; nccl: snapshots only if asked
        self._own_dir = snapshot_dir is None and self._nccl is None
        self.snapshot_dir: Path | None = snapshot_folder(snapshot_dir, own=self._own_dir)
        self.weight_sync = weight_sync
        self.max_retries = int(max_retries)
        self.startup_timeout_s = float(startup_timeout_s)
        self.keep_snapshots, self.model, self.seed = int(keep_snapshots), model, int(seed)
        self._initial_weights = initial_weights
        self._requests = 0
        self._runner = EngineLoop("RemoteEngine", "frlab-remote-engine")
        self._traffic = Traffic(request_timeout_s)
        self._sync = self._weight_sync(mode, initial_version)
        self._tasks: list[asyncio.Task] = []  # the prober and the fleet's watch

    def _weight_sync(self, mode: str | None, version: int) -> WeightSync:
        """The fleet's weight sync (snapshots or NCCL), loading a LoRA policy's adapters by name."""
        adapters = (
            None
            if self.lora is None
            else LoraAdapters(self.lora, self.snapshot_dir, self.keep_snapshots, self._fleet)
        )
        return WeightSync(
            self._fleet,
            self._traffic,
            mode=mode,
            version=version,
            model=self.model,
            snapshot_dir=self.snapshot_dir,
            keep_snapshots=self.keep_snapshots,
            nccl=self._nccl,
            adapters=adapters,
        )

    @property
    def weight_update(self) -> str | None:
        """`rollout.weight_update` (null asked: chosen when the engine starts)."""
        return self._sync.mode

    @property
    def _in_flight(self) -> int:
        """This client's requests in flight."""
        return self._traffic.in_flight

    @property
    def version(self) -> int:
        return self._sync.version

    @property
    def request_timeout_s(self) -> float:
        return self._fleet.request_timeout_s

    @property
    def probe_interval_s(self) -> float:
        return self._fleet.probe_interval_s

    @property
    def servers(self) -> list[Server]:
        """The fleet's servers, in the order of `rollout.remote.servers`."""
        return self._fleet.servers

    def stats(self) -> dict[str, int]:
        """Counters and gauges for the pool's stats (logged as `rollout/<name>`)."""
        return self._fleet.stats()

    def down_reason(self) -> str | None:
        return self._fleet.down_reason(self._traffic.syncing)

    def outage(self) -> Outage | None:
        """Set while no server is healthy (frlab.rollout.remote.breaker)."""
        return self._fleet.outage(self._traffic.syncing)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the client loop, load `initial_weights` (if given) as the snapshot of
        `initial_version` on every server, verify the fleet (at least one server at the current
        version within `startup_timeout_s`, else EngineError) and start the prober."""
        if self._runner.running:
            return
        if self._unauthenticated:
            log.warning(auth.UNAUTHENTICATED_WARNING, self._fleet.describe())
        if self._nccl is not None:
            self._nccl.load()  # one learner rank, vLLM's trainer API installed (else EngineError)
        self._runner.start()
        try:
            self._call(self._start())
        except BaseException:
            self.shutdown()
            raise

    async def _start(self) -> None:
        sync, initial, self._initial_weights = self._sync, self._initial_weights, None
        snap = None if initial is None else sync.write(initial, sync.version)
        push = None if initial is None else sync.push(initial, sync.version)
        if push is None:  # filesystem: servers must load the learner's weights to be admitted
            sync.snapshot = snap
        self._fleet.open()
        self._traffic.open()
        sync.lock = asyncio.Lock()
        if self._auto_mode:
            sync.mode = await in_flight.default_mode(self._fleet, self.model, self.lora is not None)
        await sync.admit_at_start(push, self.startup_timeout_s)
        self._fleet.last_healthy = time.monotonic()
        loop = asyncio.get_running_loop()
        syncing = lambda: self._traffic.syncing  # noqa: E731  (read by each watcher)
        watchers = [breaker.watch(self._fleet, s, sync.probe, syncing) for s in self._fleet.servers]
        self._tasks = [loop.create_task(w) for w in [*watchers, self._fleet.watch_forever()]]

    def shutdown(self) -> None:
        if self._nccl is not None:
            self._nccl.shutdown()
        if self._own_dir:
            shutil.rmtree(self.snapshot_dir, ignore_errors=True)
        self._runner.stop(self._close())

    async def _close(self) -> None:
        """Stop the prober, fail pending requests with EngineError, close the HTTP client."""
        self._traffic.stopping = True
        me = asyncio.current_task()
        others = [t for t in asyncio.all_tasks() if t is not me]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        await self._fleet.close()

    def pause(self) -> None:
        """Stop dispatching and wait until no request is in flight."""
        self._call(self._set_paused(True))

    def resume(self) -> None:
        self._call(self._set_paused(False))

    async def _set_paused(self, paused: bool) -> None:
        self._traffic.user_paused = paused
        self._traffic.refresh()
        if paused:
            await self._traffic.drain()
            async with self._sync.lock:  # an admission under way (prober) ends first
                pass

    # -- weight updates (frlab.rollout.remote.weight_sync) -----------------------------------
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Write the snapshot, stop the requests as `weight_update` says, load it on every live
        server and verify their versions."""
        if int(version) < 0:
            raise ValueError(f"update_weights version must be >= 0, got {version}")
        sync = self._sync
        snap = sync.write(state_dict, int(version))
        self._call(sync.sync(int(version), snap, sync.push(state_dict, int(version))))
        sync.prune()

    def hold_for_update(self) -> None:
        """Phase 1 of a collective update (frlab.rollout.callbacks.push_collectively): stop
        dispatching."""
        self._call(self._sync.hold())

    def stop_for_update(self) -> None:
        """Phase 2: the requests in flight drained, stopped or frozen (`weight_update`)."""
        self._call(self._sync.stop_held())

    def release_update(self) -> None:
        """Last phase: resume the servers this rank paused, dispatch again."""
        self._call(self._sync.release())

    def _call(self, coro: Any) -> Any:
        return self._runner.call(coro)

    # -- generation --------------------------------------------------------------------------
    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams
    ) -> GenerationResult:
        prompt = [int(t) for t in prompt_token_ids]
        if not prompt:
            raise ValueError("prompt_token_ids is empty")
        params.validate(off_policy_correction=False)
        return await self._runner.submit(self._generate(prompt, params))  # EngineError: not started

    async def _generate(self, prompt: list[int], params: SamplingParams) -> GenerationResult:
        try:
            return await continue_after_abort(self._dispatch, prompt, params, self._resubmitted)
        except asyncio.CancelledError:
            if (
                self._traffic.stopping
            ):  # shutdown, not the caller: fail the request like other engines
                raise EngineError("RemoteEngine shut down before the request finished") from None
            raise

    def _resubmitted(self) -> None:
        self._fleet.counts["resubmitted"] += 1

    async def _dispatch(self, prompt: list[int], params: SamplingParams) -> Fragment:
        """Send to the least-loaded healthy server; retry on another after a server fault.
        The answer's versions are exact per token (`_versions`); it may be an abort."""
        attempts = 0
        while True:
            await self._traffic.wait_gate()
            server = self._fleet.pick()
            if server is not None:
                try:
                    return await self._request(server, prompt, params)
                except ServerFault as fault:
                    self._fleet.fault(server, fault)  # logged once, when the server goes down
                    self._fleet.counts["retries"] += 1
                    log.debug(
                        "remote engine: retrying a request after %s failed: %s", server.url, fault
                    )
                    cause: Exception | None = fault
            else:
                cause = None
                await asyncio.sleep(self.probe_interval_s)
            attempts += 1
            if attempts > self.max_retries:  # the fleet's fault: the pool requeues the prompt
                raise EngineFault(
                    f"request failed after {attempts} attempts (rollout.remote.max_retries="
                    f"{self.max_retries}); servers: {self._fleet.describe()}"
                ) from cause

    async def _request(self, server: Server, prompt: list[int], params: SamplingParams) -> Fragment:
        self._requests += 1
        seed = request_seed(params, self.seed * 1_000_003, self._requests)
        generates = in_flight.generates(server, self.weight_update)  # vLLM labels, in_flight
        shape = gen.generate_request if generates else proto.completion_request
        body = shape(server.adapter or server.model or "", prompt, params, seed=seed)
        version, aborts = server.version, self._traffic.aborts
        server.in_flight += 1
        self._traffic.sent()
        try:
            path = gen.GENERATE if generates else proto.COMPLETIONS
            bound = limits.answer_bytes(len(prompt), params.max_new_tokens)
            answer = await self._fleet.post_while_up(server, path, body, bound)
        finally:
            server.in_flight -= 1
            self._traffic.answered()
        try:
            done = (
                gen.parse_generate(answer) if generates else proto.parse_completion(answer, prompt)
            )
            limits.check_tokens(done, params.max_new_tokens, self.vocab_size)
        except proto.MalformedResponse as exc:
            raise ServerFault("dead", f"garbage answer: {exc}") from exc
        resubmit.check_abort(done, aborts, self._traffic.aborts)
        versions = resubmit.token_versions(server, version, done, self.version, self.weight_update)
        self._fleet.served(server)
        return Fragment(done.token_ids, done.log_probs, versions, done.finish_reason)
