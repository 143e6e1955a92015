"""The rollout pool: one rollout per prompt, first B finishers out, staleness bounded by admission.

FlashREINFORCE (SPEC §1, §3) trains on a batch of B finished trajectories of B distinct prompts
as soon as they exist: the pool keeps up to `max_in_flight` rollouts running on an asyncio loop
in a background thread, hands out the first B that finish and carries the rest over (no drain
between steps). Finished trajectories are never dropped for being slow; staleness is bounded by
admission control (the earliest-deadline invariant and lag bookkeeping in
`frlab.rollout.admission`), so every trajectory satisfies
`learner_version - min token version <= max_policy_lag` at consumption, and the per-trajectory
lag is written into `Trajectory.info`. Rollout records and their checkpoint form live in
`frlab.rollout.rollouts`.

`mode="sync"` (collect, then train) uses the same code: `next_batch` requests exactly B/G
prompts x G samples, which run together and are handed out together; nothing else starts until
the next request. A failed sample fails its whole group (the finished siblings are counted in
`rejected_by_reason["incomplete_group"]`) and a replacement group starts.

Each handed-out batch carries its generation window (frlab.rollout.metering: generation time,
tokens/s, the learner's wait) in `stats()["generation"]`; `run_pinned` runs background work
(evaluation) that weight updates wait for (frlab.rollout.pinning); `close_admission` (after the
last planned batch) starts no more rollouts and cancels the unconsumed ones, so an evaluation
at the end of a run has the engine to itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Any

from frlab.data.batch import Trajectory
from frlab.rollout.admission import MODES as MODES  # re-exported: pool's public names
from frlab.rollout.admission import DeadlineQueue, lag_info, validate_pool_args
from frlab.rollout.admission import admission_feasible as admission_feasible
from frlab.rollout.admission import required_early as required_early
from frlab.rollout.admission import select_batch as select_batch
from frlab.rollout.agent_loop import AgentLoopConfig
from frlab.rollout.engine import Engine
from frlab.rollout.metering import GenerationMeter, MeteredEngine
from frlab.rollout.pinning import WeightPins
from frlab.rollout.rollouts import REJECT_REASONS as REJECT_REASONS
from frlab.rollout.rollouts import (
    Failure,
    Group,
    Rollout,
    as_rng_state,
    check_state,
    close_env,
    pending_records,
    ready_record,
    restore_ready,
    run_rollout,
)

log = logging.getLogger(__name__)


class RolloutPool:
    """Runs rollouts in the background and hands out batches of B finished trajectories.

    `off_policy_correction` is the objective's (`Objective.uses_off_policy_correction`): when
    True, `loop_cfg.sampling` must keep the full support (top_p=1, top_k=0) or ValueError."""

    def __init__(
        self,
        engine: Engine,
        env_factory: Callable[[], Any],
        tokenizer: Any,
        loop_cfg: AgentLoopConfig,
        *,
        batch_size: int,
        max_in_flight: int,
        max_policy_lag: int,
        mode: str = "async",
        samples_per_prompt: int = 1,
        seed: int = 0,
        num_env_workers: int = 4,
        prompt_id_offset: int = 0,
        prompt_id_stride: int = 1,
        off_policy_correction: bool = True,
    ) -> None:
        validate_pool_args(batch_size, max_in_flight, max_policy_lag, mode, samples_per_prompt)
        # Importance ratios need the full sampling support (SPEC §3): refuse top-p / top-k
        # here too, so pools built outside train.py (benches, scripts) cannot bias them.
        loop_cfg.sampling.validate(off_policy_correction)
        if num_env_workers < 1 or not 0 <= prompt_id_offset < prompt_id_stride:
            raise ValueError("need num_env_workers >= 1 and 0 <= prompt_id_offset < stride")
        self.engine = engine
        self.env_factory = env_factory
        self.tokenizer = tokenizer
        self.loop_cfg = loop_cfg
        self.batch_size = int(batch_size)
        self.max_in_flight = int(max_in_flight)
        self.max_policy_lag = int(max_policy_lag)
        self.mode = mode
        self.samples_per_prompt = int(samples_per_prompt)
        self.num_env_workers = int(num_env_workers)
        self._id_offset, self._id_stride = int(prompt_id_offset), int(prompt_id_stride)
        self._cond = threading.Condition()
        self._rng = random.Random(seed)
        self._prompt_counter = self._learner_version = self._next_consume_version = 0
        self._pending: deque[tuple[int, dict[str, Any]]] = deque()
        self._reset_queues()
        self._counts: Counter[str] = Counter()
        self._failed: Counter[str] = Counter()
        self._rejected: Counter[str] = Counter()
        self._lag_paused = False
        self._lag_max_seen = 0
        self._started = self._stopping = self._stopped = self._loading = False
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._task_env: Any = None
        self._wake: asyncio.Event | None = None
        self._tasks: set[asyncio.Task] = set()
        self._meter = GenerationMeter()
        self._metered = MeteredEngine(engine, self._meter)
        self._generation: dict[str, float] = {}
        self._admission_closed = False
        self.pins = WeightPins()

    def _reset_queues(self) -> None:
        self._queue = DeadlineQueue()  # started, not yet consumed or dropped
        self._sync_need = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine, the env executor and the event-loop thread (idempotent)."""
        with self._cond:
            if self._stopped or self._stopping:
                raise RuntimeError("RolloutPool was stopped; build a new pool")
            if self._started:
                return
            self._started = True
        self.engine.start()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            self.num_env_workers, thread_name_prefix="frlab-env"
        )
        self._task_env = self.env_factory()
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._thread_main, args=(ready,), name="frlab-rollout-loop", daemon=True
        )
        self._thread.start()
        ready.wait()

    def stop(self) -> None:
        """Cancel in-flight work; join the loop thread, env threads and engine (idempotent)."""
        with self._cond:
            if self._stopped or self._stopping:
                return
            self._stopping = True
            self._cond.notify_all()
        try:
            if self._thread is not None:
                self._notify_loop()
                self._thread.join()
        finally:
            try:
                if self._started:
                    self.engine.shutdown()
            finally:
                self.pins.shutdown()
                if self._executor is not None:
                    self._executor.shutdown(wait=True)
                close_env(self._task_env)
                if self._loop is not None:
                    self._loop.close()
                with self._cond:
                    self._stopped = True
                    self._cond.notify_all()

    def _thread_main(self, ready: threading.Event) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main(ready))
        except BaseException as exc:  # a bug in the pool itself: surface it in next_batch
            log.exception("rollout pool loop crashed")
            with self._cond:
                self._error = exc
                self._cond.notify_all()
        finally:
            ready.set()
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())

    async def _main(self, ready: threading.Event) -> None:
        self._wake = asyncio.Event()
        ready.set()
        try:
            while not self._stopping:
                self._admit()
                await self._wake.wait()
                self._wake.clear()
        finally:
            await self._cancel_all()

    async def _cancel_all(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _notify_loop(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)

    # -- admission and rollouts (loop thread) ------------------------------------------------
    def _admit(self) -> None:
        g = self.samples_per_prompt
        with self._cond:
            while not (self._stopping or self._loading or self._admission_closed):
                if self._queue.in_flight() + g > self.max_in_flight or (
                    self.mode == "sync" and self._sync_need <= 0
                ):
                    return
                version = int(self.engine.version)
                due = version + self.max_policy_lag
                if not self._queue.admits(due, g, self._next_consume_version, self.batch_size):
                    self._counts["paused_for_lag"] += not self._lag_paused
                    self._lag_paused = True
                    return
                self._lag_paused = False
                self._launch_group(version, due)

    def _launch_group(self, version: int, due: int) -> None:
        if self._pending:
            prompt_id, task = self._pending.popleft()
        else:
            prompt_id = self._id_offset + self._prompt_counter * self._id_stride
            self._prompt_counter += 1
            task = dict(self._task_env.sample_task(self._rng))
        group = Group(prompt_id, task, unresolved=self.samples_per_prompt)
        assert self._loop is not None
        for _ in range(self.samples_per_prompt):
            t = self._loop.create_task(self._run(self._queue.add(group, version, due)))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)
        self._counts["started"] += self.samples_per_prompt
        self._sync_need -= self.mode == "sync"

    async def _run(self, ro: Rollout) -> None:
        assert self._executor is not None
        args = (self._metered, self.env_factory, self.tokenizer, self.loop_cfg, ro.group)
        await run_rollout(*args, self._executor, functools.partial(self._resolve, ro))

    def _resolve(self, ro: Rollout, traj: Trajectory | None, failure: Failure | None) -> None:
        with self._cond:
            group = ro.group
            group.unresolved -= 1
            if failure is not None:
                kind, reason, exc = failure
                (self._failed if kind == "failed" else self._rejected)[reason] += 1
                log.warning("rollout of prompt %d %s (%s): %s", group.prompt_id, kind, reason, exc)
                self._queue.drop(ro)
                group.failed = True
            else:
                assert traj is not None
                self._queue.finish(ro, traj)
                self._counts["finished"] += 1
            if group.unresolved == 0:
                self._close_group(group)
            self._cond.notify_all()
        if self._wake is not None:
            self._wake.set()

    def _close_group(self, group: Group) -> None:
        dropped = self._queue.close_group(group)  # the finished siblings of a failed sample
        if dropped:
            self._rejected["incomplete_group"] += dropped
        if group.failed:
            self._sync_need += self.mode == "sync"  # start a replacement group

    # -- consumer side -----------------------------------------------------------------------
    def next_batch(self, timeout: float | None = None) -> list[Trajectory]:
        """Block until B finished trajectories can be handed out; annotate their lag."""
        called = time.monotonic()
        deadline = None if timeout is None else called + timeout
        with self._cond:
            self._request_sync_batch()
            while True:
                self._raise_if_unusable()
                chosen = self._queue.select(self._next_consume_version, self.batch_size)
                if chosen is not None:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(
                        f"no batch of {self.batch_size} in {timeout}s: {self.stats()}"
                    )
                self._cond.wait(left)
            batch = self._hand_out(chosen)
            self._generation = self._meter.take_window(time.monotonic() - called)
        self._notify_loop()
        return batch

    def close_admission(self) -> None:
        """No more batches will be asked for: start no rollout and cancel those in flight
        (their prompts stay in the checkpoint cursor and rerun on resume)."""
        with self._cond:
            self._admission_closed = True
        loop = self._loop
        if loop is not None and loop.is_running() and not loop.is_closed():
            asyncio.run_coroutine_threadsafe(self._cancel_all(), loop).result(timeout=60)

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

    def _hand_out(self, chosen: list[Rollout]) -> list[Trajectory]:
        version = self._next_consume_version
        self._queue.take(chosen)
        batch = []
        for ro in chosen:
            traj = ro.trajectory
            assert traj is not None
            info = lag_info(version, ro.start_version, traj)
            self._lag_max_seen = max(self._lag_max_seen, info["policy_lag_max"])
            self._counts["lag_violations"] += info["policy_lag_max"] > self.max_policy_lag
            traj.info.update(info)
            batch.append(traj)
        self._next_consume_version += 1
        self._counts["consumed"] += len(batch)
        self._counts["batches"] += 1
        return batch

    # -- learner side ------------------------------------------------------------------------
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
        self.engine.update_weights(state_dict, int(version))
        if int(self.engine.version) != int(version):
            raise RuntimeError(
                f"engine reports version {self.engine.version} after update_weights({version}): "
                "the weights were not applied"
            )
        self._counts["weight_syncs"] += 1
        self.set_learner_version(version)

    def stats(self) -> dict[str, Any]:
        """Counters and gauges (a consistent snapshot; safe from any thread)."""
        with self._cond:
            out: dict[str, Any] = {k: self._counts[k] for k in COUNTERS}
            out.update(
                failed=sum(self._failed.values()),
                failed_by_reason=dict(self._failed),
                rejected=sum(self._rejected.values()),
                rejected_by_reason=dict(self._rejected),
                in_flight=self._queue.in_flight(),
                queued=len(self._queue.ready),
                outstanding=len(self._queue.outstanding),
                lag_paused=self._lag_paused,
                lag_max_seen=self._lag_max_seen,
                prompts=self._prompt_counter,
                learner_version=self._learner_version,
                next_consume_version=self._next_consume_version,
                engine_version=int(self.engine.version),
                engine=engine_stats(self.engine),
                generation=dict(self._generation),
            )
            return out

    # -- checkpointing -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The data cursor: prompt counter, RNG state, prompts not yet finished (rerun on
        resume) and finished-but-unconsumed trajectories; plain Python values only, so a
        checkpoint loads with `torch.load(weights_only=True)`."""
        with self._cond:
            queue = self._queue
            return {
                "prompt_counter": self._prompt_counter,
                "rng_state": self._rng.getstate(),
                "pending": pending_records(self._pending, queue.outstanding.values(), queue.ready),
                "ready": [ready_record(ro) for ro in queue.ready],
                "learner_version": self._learner_version,
                "next_consume_version": self._next_consume_version,
            }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the cursor; in-flight work (if running) is cancelled and its prompts rerun."""
        check_state(state)
        if self._thread is not None and self._thread.is_alive() and self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._load_in_loop(state), self._loop).result()
        else:
            self._apply_state(state)

    async def _load_in_loop(self, state: Mapping[str, Any]) -> None:
        self._loading = True  # no admission while the old work is cancelled
        try:
            await self._cancel_all()
            self._apply_state(state)
        finally:
            self._loading = False
        self._notify_loop()

    def _apply_state(self, state: Mapping[str, Any]) -> None:
        with self._cond:
            self._reset_queues()
            self._prompt_counter = int(state["prompt_counter"])
            self._rng.setstate(as_rng_state(state["rng_state"]))
            self._pending = deque((int(p["prompt_id"]), dict(p["task"])) for p in state["pending"])
            self._learner_version = int(state.get("learner_version", 0))
            self._next_consume_version = int(state.get("next_consume_version", 0))
            self._queue.restore(restore_ready(state["ready"], self.max_policy_lag))
            self._cond.notify_all()


def engine_stats(engine: Any) -> dict[str, Any]:
    """The engine's own counters (remote: retries, servers_healthy, ...); {} if it has none."""
    stats = getattr(engine, "stats", None)
    return dict(stats()) if callable(stats) else {}


COUNTERS = ("started", "finished", "consumed", "batches", "paused_for_lag", "lag_violations",
            "weight_syncs")  # fmt: skip
