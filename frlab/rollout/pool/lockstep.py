"""Lockstep engine calls: the synchronous mode's deterministic engine batches.

A batched engine's numerics depend on which rows share a batch (padding widths, matrix shapes:
a row's logits differ in the last bits between batch compositions), so per-rollout seeds alone
do not make a rerun bit-identical: the batches must be the same too. In synchronous mode the
rollout pool routes every engine call through a `LockstepGate`: a call waits until EVERY live
rollout is waiting on the engine (or has finished), then all waiting calls are submitted
together, ordered by rollout key, with `Engine.generate_many` (the torch engine enqueues them
atomically, so they form the same batch whatever the thread timing). A rollout that is still
resetting or stepping its environment holds the others back: every turn is a barrier, which
costs throughput in multi-turn episodes with slow environment steps.

The gate never releases on its own: the pool calls `release()` from its loop after admitting
new work, so a rollout admitted in the same round is counted before the next batch goes out.
Each waiting or finishing client calls the pool's `wake` so that the pool checks again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from frlab.rollout.engine import Engine, EngineError, GenerationResult, SamplingParams


class LockstepClient:
    """One rollout's view of the engine (`generate` only), registered live until `close()`."""

    def __init__(self, gate: LockstepGate, key: Any) -> None:
        self.gate, self.key = gate, key
        self.request: tuple[list[int], SamplingParams, asyncio.Future[Any]] | None = None
        self.closed = False

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams
    ) -> GenerationResult:
        """Wait for the next lockstep release, then for this request's result."""
        if self.closed:
            raise EngineError(f"lockstep client {self.key} is closed")
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.request = (list(prompt_token_ids), params, waiter)
        self.gate.wake()
        try:
            submitted = await waiter
        finally:
            if self.request is not None and self.request[2] is waiter:  # cancelled while waiting
                self.request = None
        return await submitted

    def close(self) -> None:
        """The rollout is over: stop counting it as live."""
        if not self.closed:
            self.closed = True
            self.gate.live.pop(self.key, None)
            if self.request is not None and not self.request[2].done():
                self.request[2].cancel()
            self.gate.wake()


class LockstepGate:
    """Releases engine calls in deterministic batches (see module docstring)."""

    def __init__(self, engine: Engine, wake: Callable[[], None]) -> None:
        self.engine, self.wake = engine, wake
        self.live: dict[Any, LockstepClient] = {}

    def client(self, key: Any) -> LockstepClient:
        """Register a rollout (live from now on); keys must be unique and orderable."""
        if key in self.live:
            raise ValueError(f"lockstep key {key!r} is already live")
        client = LockstepClient(self, key)
        self.live[key] = client
        return client

    def release(self) -> int:
        """If every live client waits, submit all their calls in key order; how many went."""
        clients = list(self.live.values())
        if not clients or any(c.request is None for c in clients):
            return 0
        clients.sort(key=lambda c: c.key)
        requests = [c.request for c in clients]
        for c in clients:
            c.request = None  # taken: a second release() before they resume must not resend
        futures = self._submit([(r[0], r[1]) for r in requests])  # type: ignore[index]
        for request, future in zip(requests, futures, strict=True):
            waiter = request[2]  # type: ignore[index]
            if waiter.done():  # the caller was cancelled meanwhile
                future.cancel()
            else:
                waiter.set_result(future)
        return len(clients)

    def _submit(
        self, requests: list[tuple[list[int], SamplingParams]]
    ) -> list[asyncio.Future[GenerationResult]]:
        """All requests at once; if the engine refuses the lot (one bad prompt), one by one, so
        each caller gets its own error."""
        try:
            return self.engine.generate_many(requests)
        except Exception:
            return [self._one(request) for request in requests]

    def _one(self, request: tuple[list[int], SamplingParams]) -> asyncio.Future[GenerationResult]:
        try:
            (future,) = self.engine.generate_many([request])
            return future
        except Exception as exc:
            failed: asyncio.Future[GenerationResult] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed
