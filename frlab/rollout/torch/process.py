"""`torch_process` engine: the torch engine's sampler in a child process, weights in shared memory.

The in-process torch engine (frlab.rollout.torch.engine) decodes in a thread of the learner's
process, so on CPU its Python work and the learner's take turns on one interpreter lock: with
asynchronous collection the two serialise and the pool gains less than the cores allow. This
engine runs the same sampler (the same `TorchEngine` code: continuous batching, per-request
seeds, the sampler's own log-probs and versions) in a spawned child process:

- weights: the engine's private copy of the policy lives in shared memory; the child maps the
  same storage. `update_weights` closes a gate (the child finishes its current decode step and
  waits), takes the step lock, copies the new tensors in place, sets the shared version, and
  reopens the gate: nothing is serialised or written to disk, and tokens sampled afterwards carry
  the new version, exactly as with the in-process engine;
- requests and results travel over a pipe (token ids, log-probs, versions, finish reason, MoE
  routing when recorded); a reader thread resolves each request's future.

Failure: the child must report ready within `start_timeout_s`; if it dies, every pending request
fails with an EngineError naming its exit code; `shutdown` stops it, joins it with a deadline
and kills it past that. The child ignores SIGINT (the parent shuts it down) and exits when the
parent's end of the pipe closes. CPU only: CUDA runs use `rollout/engine=torch` or vLLM.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.multiprocessing as tmp

from frlab.errors import ConfigError
from frlab.rollout.engine import (
    WEIGHT_UPDATES,
    Engine,
    EngineError,
    GenerationResult,
    SamplingParams,
    resolve_weight_update,
)
from frlab.rollout.torch.child import child_main
from frlab.rollout.torch.common import check_prompt, check_update, private_copy, require_moe
from frlab.rollout.torch.request_state import settle
from frlab.rollout.torch.shared_weights import check_open_files, check_shared_memory
from frlab.rollout.weight_modes import wait_drained

if TYPE_CHECKING:
    from transformers import PreTrainedModel

STOP_WAIT_S = 30.0  # shutdown: the child's own clean stop, then terminate / kill
# update_weights: the child's current decode step (one prefill of up to max_batch_size prompts
# on CPU, or one decode step) must end within this; a dead child fails at once
UPDATE_LOCK_S = 600.0
POLL_S = 0.5  # update_weights re-checks that the child is alive this often


class ProcessTorchEngine(Engine):
    """`TorchEngine` decoding in a child process over shared-memory weights (CPU)."""

    @classmethod
    def for_policy(cls, policy: PreTrainedModel, **settings: Any) -> ProcessTorchEngine:
        """The engine of `rollout/engine=torch_process`: a copy of the learner's `policy`
        (`settings`
        are the constructor's keywords, from the engine node)."""
        return cls(policy, **settings)

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        device: str | torch.device,
        max_batch_size: int,
        seed: int,
        record_routing: bool,
        num_threads: int,
        start_timeout_s: float,
        packed_prefill: bool,
        weight_update: str | None,
        initial_version: int = 0,
    ) -> None:
        self.weight_update = resolve_weight_update(
            weight_update, self.weight_updates(), "torch_process", record_routing=record_routing
        )
        if torch.device(device).type != "cpu":
            raise ConfigError(
                "rollout.engine.device",
                f"rollout.engine.device={device!r}: rollout/engine=torch_process serves on CPU "
                "only (use rollout/engine=torch or vllm on a GPU)",
            )
        if max_batch_size < 1:
            raise ConfigError(
                "rollout.engine.max_batch_size", f"must be >= 1, got {max_batch_size}"
            )
        if num_threads < 1:
            raise ConfigError("rollout.engine.num_threads", f"must be >= 1, got {num_threads}")
        if not start_timeout_s > 0:
            raise ConfigError(
                "rollout.engine.start_timeout_s", f"must be > 0, got {start_timeout_s}"
            )
        if record_routing:
            require_moe(model, "rollout.engine.record_routing=true")
        check_shared_memory(model)
        check_open_files(model)
        self._model = private_copy(model, "cpu").share_memory()
        self.vocab_size = int(self._model.get_input_embeddings().weight.shape[0])
        self._settings = {
            "device": "cpu",  # checked above: this engine serves on the CPU only
            "seed": int(seed),
            "max_batch_size": int(max_batch_size),
            "record_routing": bool(record_routing),
            "num_threads": int(num_threads),
            "packed_prefill": bool(packed_prefill),
            "weight_update": self.weight_update,
        }
        self.start_timeout_s = float(start_timeout_s)
        ctx = tmp.get_context("spawn")
        self._ctx = ctx
        self._step = ctx.Lock()  # held by the child for each decode step, by us for a copy
        # 1: the child may step; 0: paused or updating. A plain shared flag the child polls, not
        # an Event: an Event's set() waits for every sleeper to wake, a killed child never does.
        self._gate = ctx.Value("b", 1, lock=False)
        self._version = ctx.Value("q", int(initial_version), lock=False)
        # the weight-update modes' shared hooks: admission open, rows decoding (-1: not yet
        # published since admission closed), re-prefill the running rows at the next step
        self._admit = ctx.Value("b", 1, lock=False)
        self._running = ctx.Value("i", 0, lock=False)
        self._resubmit = ctx.Value("b", 0, lock=False)
        self._state = threading.Lock()
        self._send_lock = threading.Lock()
        self._futures: dict[int, concurrent.futures.Future] = {}
        self._ids = itertools.count()
        self._paused = self._stopping = False
        self._process: Any = None
        self._conn: Any = None
        self._reader: threading.Thread | None = None
        self._exit_reason = ""

    serves_lora = True  # its copy of the policy is the learner's PeftModel
    devices = ("cpu",)  # the child decodes over shared-memory CPU weights
    records_routing = True  # the child's TorchEngine records, the routing comes back with it

    @classmethod
    def weight_updates(cls) -> tuple[str, ...]:
        return WEIGHT_UPDATES  # the child is a TorchEngine: all three, in_flight by default

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return int(self._version.value)

    @property
    def model(self) -> PreTrainedModel:
        """The shared copy of the weights the child decodes with (read it only while paused)."""
        return self._model

    def down_reason(self) -> str | None:
        """The child's exit, unless this engine was shut down on purpose."""
        with self._state:
            return None if self._stopping or not self._exit_reason else self._exit_reason

    def start(self) -> None:
        with self._state:
            if self._stopping or self._exit_reason:
                raise EngineError(
                    "ProcessTorchEngine was shut down or its process failed; build a new engine"
                    f"{' (' + self._exit_reason + ')' if self._exit_reason else ''}"
                )
            if self._process is not None:
                return
            parent_conn, child_conn = self._ctx.Pipe()
            process = self._ctx.Process(
                target=child_main,
                name="frlab-torch-engine",
                daemon=True,
                args=(
                    child_conn,
                    self._model,
                    self._step,
                    self._gate,
                    self._version,
                    (self._admit, self._running, self._resubmit),
                    os.getpid(),
                    self._settings,
                ),
            )
            process.start()
            child_conn.close()
            self._process, self._conn = process, parent_conn
        self._await_ready()
        self._reader = threading.Thread(target=self._read, name="frlab-engine-reader", daemon=True)
        self._reader.start()

    def _await_ready(self) -> None:
        """Wait for the child's ready message (deadline start_timeout_s); stop it on failure."""
        try:
            if not self._conn.poll(self.start_timeout_s):
                raise EngineError(
                    f"torch engine process did not start within {self.start_timeout_s:.0f} s "
                    "(rollout.engine.start_timeout_s)"
                )
            message = self._conn.recv()
            if message[0] != "ready":
                raise EngineError(f"torch engine process failed to start: {message[1]}")
        except (EOFError, OSError) as exc:
            self._process.join(STOP_WAIT_S)
            error = EngineError(
                f"torch engine process exited during start (exit code {self._process.exitcode})"
            )
            self._exit_reason = str(error)
            self._stop_process()
            self._fail(self._exit_reason)
            raise error from exc
        except BaseException as exc:
            self._exit_reason = f"start failed: {exc}"
            self._stop_process()
            self._fail(self._exit_reason)
            raise

    def shutdown(self) -> None:
        with self._state:
            self._stopping = True
        self._stop_process()
        self._fail("engine shut down before the request finished")

    def _stop_process(self) -> None:
        """Ask the child to stop, join it (deadline STOP_WAIT_S), then terminate / kill it."""
        process, conn = self._process, self._conn
        if process is None:
            return
        self._gate.value = 1  # a paused child must reach its stop check
        self._send(("stop",))
        process.join(STOP_WAIT_S)
        for escalate in (process.terminate, process.kill):
            if process.is_alive():
                escalate()
                process.join(STOP_WAIT_S)
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(STOP_WAIT_S)
        conn.close()

    def pause(self) -> None:
        with self._state:
            self._paused = True
            self._gate.value = 0

    def resume(self) -> None:
        with self._state:
            self._paused = False
            self._gate.value = 1

    # -- requests ----------------------------------------------------------------------------
    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams
    ) -> GenerationResult:
        (future,) = self.generate_many([(prompt_token_ids, params)])
        return await future

    def generate_many(
        self, requests: Sequence[tuple[list[int], SamplingParams]]
    ) -> list[asyncio.Future[GenerationResult]]:
        """Validate every request, then send them together, in order (one batch admission)."""
        batch = []
        for prompt, params in requests:
            params.validate(off_policy_correction=False)
            batch.append((next(self._ids), check_prompt(prompt, self.vocab_size), params))
        futures = [concurrent.futures.Future() for _ in batch]
        with self._state:
            if self._stopping or self._process is None or self._exit_reason:
                raise EngineError(
                    "ProcessTorchEngine is not running: call start() first (or it was shut "
                    f"down{'; ' + self._exit_reason if self._exit_reason else ''})"
                )
            self._futures.update({rid: f for (rid, _, _), f in zip(batch, futures, strict=True)})
        if not self._send(("generate", batch)):
            self._fail("torch engine process is not reachable", [rid for rid, _, _ in batch])
        return [self._awaitable(rid, f) for (rid, _, _), f in zip(batch, futures, strict=True)]

    def _awaitable(self, rid: int, future: concurrent.futures.Future) -> asyncio.Future:
        """An asyncio future on the running loop; cancelling it abandons the child's request."""
        wrapped = asyncio.wrap_future(future)

        def on_done(f: asyncio.Future) -> None:
            if f.cancelled():
                with self._state:
                    self._futures.pop(rid, None)
                self._send(("cancel", rid))

        wrapped.add_done_callback(on_done)
        return wrapped

    def _send(self, message: tuple) -> bool:
        """Send `message` to the child; False (never raises) when the pipe is closed."""
        try:
            with self._send_lock:
                self._conn.send(message)
            return True
        except (OSError, ValueError, AttributeError):
            return False

    def _read(self) -> None:
        """The reader thread: resolve futures from the child's results until the pipe closes,
        then fail whatever is left with the child's exit code."""
        conn = self._conn
        try:
            while True:
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    break
                self._resolve(message)
        finally:
            self._process.join(STOP_WAIT_S if self._stopping else 5.0)
            with self._state:
                self._exit_reason = (
                    f"torch engine process exited (exit code {self._process.exitcode})"
                )
            self._fail(self._exit_reason)

    def _resolve(self, message: tuple) -> None:
        """Settle the future of one reply ("result" or "error"); a malformed reply fails it."""
        with self._state:
            future = self._futures.pop(message[1], None)
        if future is None:
            return
        try:
            if message[0] == "result":
                token_ids, log_probs, versions, reason, routing = message[2:]
                routing = None if routing is None else torch.from_numpy(routing)
                outcome = GenerationResult(token_ids, log_probs, versions, reason, routing)
            else:
                outcome = EngineError(message[2])
        except Exception as exc:
            outcome = EngineError(f"bad reply from the torch engine process: {exc!r}")
        settle(future, outcome)

    def _fail(self, reason: str, rids: list[int] | None = None) -> None:
        """Fail the requests `rids` (None: every pending one) with EngineError(reason)."""
        with self._state:
            if rids is None:
                futures, self._futures = list(self._futures.values()), {}
            else:
                futures = [self._futures.pop(rid, None) for rid in rids]
        for future in futures:
            if future is not None:
                settle(future, EngineError(reason))

    # -- weights -----------------------------------------------------------------------------
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load `state_dict` between two of the child's decode steps, as `weight_update` says
        (frlab.rollout.torch.engine: the same three modes, driven through shared flags)."""
        own = check_update(self._model, state_dict, version)
        try:
            if self.weight_update == "drain":
                self._drain()
            self._gate.value = 0
            self._take_step_lock()
            try:
                with torch.no_grad():
                    for name, tensor in state_dict.items():
                        own[name].copy_(tensor.detach())
                self._version.value = int(version)
                self._resubmit.value = int(self.weight_update == "resubmit")
            finally:
                self._step.release()
        finally:
            self._admit.value = 1
            with self._state:
                if not self._paused:
                    self._gate.value = 1

    def _drain(self) -> None:
        """Close admission, then wait until the child reports no row decoding
        (frlab.rollout.weight_modes.wait_drained: EngineError past the deadline, or at once
        when the child is not running)."""
        self._admit.value, self._running.value = 0, -1
        wait_drained(
            lambda: self._running.value, lambda left: time.sleep(0.002), down=self._not_running
        )

    def _not_running(self) -> str | None:
        """Why the child cannot decode (None while it runs)."""
        if self._exit_reason or self._process is None or not self._process.is_alive():
            return "the torch engine process is not running"
        return None

    def _take_step_lock(self) -> None:
        """Wait for the child's current decode step (deadline UPDATE_LOCK_S; a dead child,
        which may have died holding the lock, fails at once)."""
        deadline = time.monotonic() + UPDATE_LOCK_S
        while not self._step.acquire(timeout=POLL_S):
            reason = self._not_running()
            if reason is not None:
                raise EngineError(f"update_weights: {reason}")
            if time.monotonic() > deadline:
                raise EngineError(
                    f"update_weights: the torch engine process did not finish its decode step "
                    f"within {UPDATE_LOCK_S:.0f} s"
                )
