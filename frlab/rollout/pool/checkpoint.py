"""The rollout pool's checkpoint: what `RolloutPool.state_dict()` holds and how it is restored.

The data cursor (prompt counter, RNG and task-sampler state), the prompts not yet finished
(rerun on resume), the finished-but-unconsumed trajectories (frlab.rollout.pool.rollouts), the
learner's versions and the counters; plain Python values only, so a checkpoint loads with
`torch.load(weights_only=True)`. Loading into a running pool first cancels its in-flight work
on the loop thread, with admission held until the state is in place.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from frlab.rollout.pool.admission import DeadlineQueue
from frlab.rollout.pool.loop_thread import STOP_WAIT_S, LoopThread
from frlab.rollout.pool.rollouts import check_state, ready_record, restore_ready
from frlab.rollout.pool.state import PoolCounters, PromptCursor


class CheckpointSide:
    """`state_dict` and `load_state_dict` of `RolloutPool` (frlab.rollout.pool.pool)."""

    max_policy_lag: int
    _cond: threading.Condition
    _cursor: PromptCursor
    _queue: DeadlineQueue
    _stats: PoolCounters
    _runner: LoopThread
    _learner_version: int
    _next_consume_version: int
    _loading: bool

    _reset_queues: Callable[[], None]  # RolloutPool._reset_queues: an empty queue

    def state_dict(self) -> dict[str, Any]:
        """The data cursor: prompt counter, RNG and task-sampler state, prompts not yet
        finished (rerun on resume) and finished-but-unconsumed trajectories; plain Python
        values only, so a checkpoint loads with `torch.load(weights_only=True)`."""
        with self._cond:
            queue = self._queue
            return {
                **self._cursor.state_dict(queue.outstanding.values(), queue.ready),
                "ready": [ready_record(ro) for ro in queue.ready],
                "learner_version": self._learner_version,
                "next_consume_version": self._next_consume_version,
                "counters": self._stats.records(),
            }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the cursor; in-flight work (if running) is cancelled and its prompts rerun."""
        check_state(state)
        if self._runner.is_alive():
            self._runner.run(self._load_in_loop(state), timeout=STOP_WAIT_S)
        else:
            self._apply_state(state)

    async def _load_in_loop(self, state: Mapping[str, Any]) -> None:
        self._loading = True  # no admission while the old work is cancelled
        try:
            await self._runner.cancel_all()
            self._apply_state(state)
        finally:
            self._loading = False
        self._runner.wake()

    def _apply_state(self, state: Mapping[str, Any]) -> None:
        with self._cond:
            self._reset_queues()
            self._cursor.load_state_dict(state)
            self._learner_version = int(state.get("learner_version", 0))
            self._next_consume_version = int(state.get("next_consume_version", 0))
            self._queue.restore(restore_ready(state["ready"], self.max_policy_lag))
            self._stats.restore(state.get("counters"))
            self._cond.notify_all()
