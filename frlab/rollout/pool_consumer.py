"""The learner-facing side of the rollout pool: batches out, versions and weights in.

`ConsumerSide` is mixed into `frlab.rollout.pool.RolloutPool`, which owns the event loop, the
admission of new rollouts and the checkpoint. `next_batch` waits (with a deadline) until the
queue can hand out B finished trajectories under the lag bound (`DeadlineQueue.select`,
frlab.rollout.admission), annotates each with its policy lag and, in sync mode, orders them by
admission (prompt order, independent of timing). `set_learner_version` and `update_weights`
move the versions the lag bound is counted from; `close_admission` ends the run's rollouts;
`run_pinned` runs work (evaluation) that weight updates wait for.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from frlab.data.batch import Trajectory
from frlab.rollout.admission import DeadlineQueue, lag_info
from frlab.rollout.engine import Engine, EngineDown
from frlab.rollout.loop_thread import LoopThread
from frlab.rollout.metering import GenerationMeter
from frlab.rollout.pinning import WeightPins
from frlab.rollout.pool_state import PoolCounters
from frlab.rollout.rollouts import Rollout

STOP_WAIT_S = 10.0  # longest wait for the loop thread, the engine, and env closes


class ConsumerSide:
    """`next_batch`, `close_admission`, `run_pinned`, `set_learner_version`, `update_weights`."""

    engine: Engine
    mode: str
    batch_size: int
    samples_per_prompt: int
    max_policy_lag: int
    pins: WeightPins
    _cond: threading.Condition
    _queue: DeadlineQueue
    _stats: PoolCounters
    _runner: LoopThread
    _meter: GenerationMeter
    _sync_need: int
    _learner_version: int
    _next_consume_version: int
    _generation: dict[str, float]
    _error: BaseException | None
    _started: bool
    _stopping: bool
    _stopped: bool
    _admission_closed: bool
    _waiting: int
    stats: Callable[[], dict[str, Any]]  # RolloutPool.stats
    _notify_loop: Callable[[], None]  # RolloutPool._notify_loop: wake the admission loop

    # -- batches out -------------------------------------------------------------------------
    def next_batch(self, timeout: float | None = None) -> list[Trajectory]:
        """Block until B finished trajectories can be handed out; annotate their lag."""
        called = time.monotonic()
        deadline = None if timeout is None else called + timeout
        lag_wait = 0.0  # waited with B finished ready: only the lag bound held the batch back
        with self._cond:
            self._request_sync_batch()
            while True:
                self._raise_if_unusable()
                chosen = self._queue.select(self._next_consume_version, self.batch_size)
                if chosen is not None:
                    break
                self._raise_if_engine_down()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(
                        f"no batch of {self.batch_size} in {timeout}s: {self.stats()}"
                    )
                held, since = len(self._queue.ready) >= self.batch_size, time.monotonic()
                self._waiting += 1
                try:
                    self._cond.wait(left)
                finally:
                    self._waiting -= 1
                lag_wait += (time.monotonic() - since) if held else 0.0
            batch = self._hand_out(chosen)
            self._generation = self._meter.take_window(time.monotonic() - called, lag_wait)
        self._notify_loop()
        return batch

    def close_admission(self) -> None:
        """No more batches will be asked for: start no rollout and cancel those in flight
        (their prompts stay in the checkpoint cursor and rerun on resume)."""
        with self._cond:
            self._admission_closed = True
        if self._runner.is_alive():
            self._runner.run(self._runner.cancel_all(), timeout=STOP_WAIT_S)

    def run_pinned(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        """Run `fn(*args)` in the background; `update_weights` waits until it has finished."""
        return self.pins.run(fn, *args)

    def _request_sync_batch(self) -> None:
        if self.mode == "sync" and self._sync_need <= 0:
            groups = self._queue.num_groups()
            self._sync_need = self.batch_size // self.samples_per_prompt - groups
            self._notify_loop()

    def _raise_if_unusable(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"rollout pool loop crashed: {self._error!r}") from self._error
        if not self._started or self._stopping or self._stopped:
            raise RuntimeError("RolloutPool is not running: call start() (and not after stop())")
        version, learner = int(self.engine.version), self._next_consume_version
        if not self._queue.outstanding and version + self.max_policy_lag < learner:
            raise RuntimeError(
                f"rollout pool stalled: engine version {version} + rollout.max_policy_lag "
                f"{self.max_policy_lag} < learner version {learner}, so no rollout may start; "
                "push weights (WeightSyncCallback, rollout.sync_every <= rollout.max_policy_lag)"
            )

    def _raise_if_engine_down(self) -> None:
        """EngineDown when no batch is ready and the engine says it can serve nothing more."""
        down = self.engine.down_reason()
        if down is not None:
            raise EngineDown(f"the rollout engine is down: {down}")

    def _hand_out(self, chosen: list[Rollout]) -> list[Trajectory]:
        version = self._next_consume_version
        self._queue.take(chosen)
        if self.mode == "sync":  # admission (prompt) order, not the timing-dependent finish order
            chosen = sorted(chosen, key=lambda ro: ro.seq)
        batch = []
        for ro in chosen:
            traj = ro.trajectory
            assert traj is not None
            info = lag_info(version, ro.start_version, traj)
            self._stats.lag_max_seen = max(self._stats.lag_max_seen, info["policy_lag_max"])
            self._stats.counts["lag_violations"] += info["policy_lag_max"] > self.max_policy_lag
            traj.info.update(info)
            batch.append(traj)
        self._next_consume_version += 1
        self._stats.counts["consumed"] += len(batch)
        self._stats.counts["batches"] += 1
        return batch

    # -- versions and weights in -------------------------------------------------------------
    def set_learner_version(self, version: int) -> None:
        """The learner has completed `version` optimizer steps; its next batch trains at >= it."""
        with self._cond:
            self._learner_version = int(version)
            self._next_consume_version = max(self._next_consume_version, int(version))
            self._cond.notify_all()
        self._notify_loop()

    def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Push learner weights at `version` to the engine (it pauses, loads, bumps, resumes)."""
        if int(version) < int(self.engine.version):
            raise ValueError(f"update_weights version {version} < engine {self.engine.version}")
        self.pins.wait()  # an evaluation in flight measures the current weights
        try:
            self.engine.update_weights(state_dict, int(version))
        except Exception as exc:
            down = self.engine.down_reason()
            if down is not None:  # the learner step is done: a safe point to stop at
                raise EngineDown(f"the rollout engine is down: {down}") from exc
            raise
        if int(self.engine.version) != int(version):
            raise RuntimeError(
                f"engine reports version {self.engine.version} after update_weights({version}): "
                "the weights were not applied"
            )
        self._stats.counts["weight_syncs"] += 1
        self.set_learner_version(version)
