"""The child side of `rollout/engine=torch_process` (frlab.rollout.torch.process).

`child_main` runs in the spawned process: a `TorchEngine` over the parent's shared-memory
weights (no copy), whose decode steps wait for the parent's gate and hold the shared step lock,
and whose tokens carry the shared version; a pipe loop queues the parent's requests and sends
each result (or error) back as it resolves. SIGINT is ignored (the parent stops the child);
the loop ends at a stop message or when the parent's end of the pipe closes.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

import torch

from frlab.rollout.engine import EngineError
from frlab.rollout.torch.engine import TorchEngine
from frlab.rollout.torch.request_state import Request

if TYPE_CHECKING:
    from transformers import PreTrainedModel

POLL_S = 0.5  # the gate / lock waits re-check that the parent is alive this often
GATE_POLL_S = (0.001, 0.02)  # a closed gate is polled from 1 ms, backing off to 20 ms


class _GatedStep:
    """The child's step lock: wait for an open gate, then take the shared lock; both waits
    re-check that the parent is alive (a parent killed mid-update must not hang the child)."""

    def __init__(self, lock: Any, gate: Any, parent_pid: int) -> None:
        self.lock, self.gate, self.parent_pid = lock, gate, parent_pid

    def __enter__(self) -> None:
        checked, pause = time.monotonic(), GATE_POLL_S[0]
        while True:
            if self.gate.value:
                if self.lock.acquire(timeout=POLL_S):
                    if self.gate.value:
                        return
                    self.lock.release()  # closed while we waited: let the update in
            else:  # a weight copy takes milliseconds; a pause may last long
                time.sleep(pause)
                pause = min(2 * pause, GATE_POLL_S[1])
            if time.monotonic() - checked > POLL_S:
                checked = time.monotonic()
                if os.getppid() != self.parent_pid:
                    raise EngineError("the learner process exited")

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


class _SharedWeightsEngine(TorchEngine):
    """The child's TorchEngine: decodes over the shared weights as they are (no copy), steps
    under the gated shared lock, stamps tokens with the shared version, and keeps the
    weight-update hooks in shared memory (`modes`: admission open, rows decoding, re-prefill
    asked), which the parent's `update_weights` drives."""

    _admit_poll_s = 0.005  # the parent changes the hooks without notifying our condition

    def __init__(
        self, model: PreTrainedModel, step: _GatedStep, version: Any, modes: Any, **kw: Any
    ) -> None:
        self._shared_version = version
        self._admit_flag, self._running_count, self._resubmit_flag = modes
        super().__init__(model, initial_version=int(version.value), **kw)
        self._step_lock = step

    def _private_model(self, model: PreTrainedModel) -> PreTrainedModel:
        return model.eval()

    @property
    def version(self) -> int:
        return int(self._shared_version.value)

    def _publish_running(self, running: int) -> None:
        self._running_count.value = int(running)

    def _admitting(self) -> bool:
        return bool(self._admit_flag.value)

    def _take_resubmit(self) -> bool:
        asked = bool(self._resubmit_flag.value)
        self._resubmit_flag.value = 0
        return asked


def child_main(
    conn: Any,
    model: PreTrainedModel,
    lock: Any,
    gate: Any,
    version: Any,
    modes: Any,
    parent_pid: int,
    settings: dict[str, Any],
) -> None:
    """The child process: serve requests from `conn` until told to stop or the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent shuts us down
    try:
        torch.set_num_threads(settings["num_threads"])
        step = _GatedStep(lock, gate, parent_pid)
        with step:  # the engine's start check reads the weights: not during a parent's copy
            engine = _SharedWeightsEngine(
                model,
                step,
                version,
                modes,
                device=settings["device"],
                seed=settings["seed"],
                max_batch_size=settings["max_batch_size"],
                record_routing=settings["record_routing"],
                packed_prefill=settings["packed_prefill"],
                weight_update=settings["weight_update"],
            )
        engine.start()
    except Exception as exc:
        conn.send(("failed", repr(exc)))
        return
    send_lock = threading.Lock()
    conn.send(("ready",))
    requests: dict[int, Request] = {}
    try:
        _serve_pipe(conn, engine, requests, send_lock, parent_pid)
    finally:
        engine.shutdown()


def _serve_pipe(
    conn: Any,
    engine: _SharedWeightsEngine,
    requests: dict[int, Request],
    send_lock: threading.Lock,
    parent_pid: int,
) -> None:
    """Read the parent's messages: generate (queue a batch), cancel (abandon one), stop; end
    when the pipe closes or the parent is gone (a pipe end inherited elsewhere stays open)."""
    while True:
        try:
            if not conn.poll(POLL_S):
                if os.getppid() != parent_pid:
                    return
                continue
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "stop":
            return
        if message[0] == "cancel":
            req = requests.pop(message[1], None)
            if req is not None and not req.future.cancel():  # not admitted yet: never prefilled
                req.abandoned = True  # decoding: dropped at the next step
            continue
        batch = message[1]
        try:
            reqs = engine._enqueue([(prompt, params) for _, prompt, params in batch])
        except Exception as exc:
            for rid, _, _ in batch:
                _reply(
                    conn, send_lock, ("error", rid, f"torch engine refused the request: {exc!r}")
                )
            continue
        for (rid, _, _), req in zip(batch, reqs, strict=True):
            requests[rid] = req
            req.future.add_done_callback(_replier(conn, send_lock, requests, rid))


def _replier(conn: Any, send_lock: threading.Lock, requests: dict[int, Request], rid: int) -> Any:
    """A done-callback sending request `rid`'s result (or error) to the parent."""

    def reply(future: concurrent.futures.Future) -> None:
        requests.pop(rid, None)
        if future.cancelled():
            return  # cancelled by the parent, which no longer waits for it
        exc = future.exception()
        if exc is not None:
            _reply(conn, send_lock, ("error", rid, str(exc)))
            return
        r = future.result()
        routing = None if r.routing is None else r.routing.numpy()
        _reply(
            conn,
            send_lock,
            ("result", rid, r.token_ids, r.log_probs, r.versions, r.finish_reason, routing),
        )

    return reply


def _reply(conn: Any, send_lock: threading.Lock, message: tuple) -> None:
    try:
        with send_lock:
            conn.send(message)
    except (OSError, ValueError):
        pass  # the parent is gone; the pipe loop ends at its next read
