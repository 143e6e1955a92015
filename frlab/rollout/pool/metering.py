"""Generation time and throughput of the rollouts behind each learner batch.

In asynchronous collection generation overlaps learning, so the time the engine spent on a
batch cannot be read off the step time. `MeteredEngine` wraps the pool's engine for the
training rollouts (evaluation requests go to the engine directly and are not counted) and
feeds a `GenerationMeter`: the wall time during which at least one generate call was in
flight (overlapping calls count once) and the tokens of the calls that returned. The pool
closes a window each time it hands out a batch (`take_window`), so every optimizer step gets:

- `timing/generation_s`: seconds with at least one training generate call in flight since the
  previous batch was handed out;
- `timing/generation_tokens_per_s`: tokens returned in that window / `generation_s`;
- `timing/batch_wait_s`: how long the learner waited for this batch (`next_batch`); near 0
  when generation keeps ahead of the learner, the whole collection time when it does not;
- `timing/lag_wait_s`: the part of that wait during which B finished trajectories were ready
  but the lag bound required rollouts still running in this batch (frlab.rollout.pool.admission):
  time lost to `rollout.max_policy_lag` rather than to generation throughput. A large share
  means heavy-tailed episodes meet a tight bound; a larger bound trades it for staleness.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from frlab.rollout.engine import GenerationResult, SamplingParams

GENERATION_S = "timing/generation_s"
TOKENS_PER_S = "timing/generation_tokens_per_s"
BATCH_WAIT_S = "timing/batch_wait_s"
LAG_WAIT_S = "timing/lag_wait_s"


class GenerationMeter:
    """Busy time (union of in-flight intervals) and returned tokens, per window."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._active = 0
        self._since = 0.0  # start of the current busy interval (or of the window)
        self._busy = 0.0
        self._tokens = 0

    def started(self) -> None:
        with self._lock:
            if self._active == 0:
                self._since = self._clock()
            self._active += 1

    def finished(self, tokens: int) -> None:
        with self._lock:
            self._active -= 1
            self._tokens += int(tokens)
            if self._active == 0:
                self._busy += self._clock() - self._since

    def take_window(self, wait_s: float, lag_wait_s: float = 0.0) -> dict[str, float]:
        """This window's metrics (see the module docstring); starts the next window."""
        with self._lock:
            now = self._clock()
            busy = self._busy + (now - self._since if self._active else 0.0)
            tokens = self._tokens
            self._busy, self._tokens = 0.0, 0
            if self._active:
                self._since = now
        rate = tokens / busy if busy > 0 else 0.0
        return {
            GENERATION_S: busy,
            TOKENS_PER_S: rate,
            BATCH_WAIT_S: float(wait_s),
            LAG_WAIT_S: float(lag_wait_s),
        }


class MeteredEngine:
    """The engine as the agent loop sees it, with every `generate` call metered."""

    def __init__(self, engine: Any, meter: GenerationMeter) -> None:
        self._engine, self._meter = engine, meter

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams
    ) -> GenerationResult:
        self._meter.started()
        tokens = 0
        try:
            result = await self._engine.generate(prompt_token_ids, params)
            tokens = len(result.token_ids)
            return result
        finally:
            self._meter.finished(tokens)

    def generate_many(
        self, requests: Sequence[tuple[list[int], SamplingParams]]
    ) -> list[asyncio.Future[GenerationResult]]:
        """The engine's batched submission (sync mode's lockstep gate), each request metered."""
        futures = self._engine.generate_many(requests)
        for future in futures:
            self._meter.started()
            future.add_done_callback(self._finished)
        return futures

    def _finished(self, future: asyncio.Future[GenerationResult]) -> None:
        ok = not future.cancelled() and future.exception() is None
        self._meter.finished(len(future.result().token_ids) if ok else 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)
