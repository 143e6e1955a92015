"""`RolloutPool`: one rollout per prompt, first B finishers out, staleness bounded by admission.

FlashREINFORCE (paper, Sec. 3) trains on a batch of B finished trajectories of B distinct
prompts as soon as they exist: the pool keeps up to `max_in_flight` rollouts running on an
asyncio loop in a background thread, hands out the first B that finish and carries the rest
over (no drain between steps). Finished trajectories are never dropped for being slow;
admission control (`admission`) bounds staleness, so every trajectory satisfies
`learner_version - min token version <= max_policy_lag` when it is consumed (its lag is in
`Trajectory.info`).

Group baselines (GRPO; `samples_per_prompt` G > 1) use the same pipeline: a prompt's G samples
are admitted together, batches hold whole groups, and a failed sample fails its group.
`mode="sync"` (collect, then train) too: `next_batch` requests exactly B/G prompts x G samples,
handed out in prompt order; a failed group is counted (`incomplete_group`) and replaced; with
per-rollout seeds (frlab.rollout.seeding) and the lockstep gate, two sync runs on the CPU torch
engine are bit-identical. Every wait has a deadline (the agent loop's per call, STOP_WAIT_S
when stopping), and the counters and task sampler's state travel with `state_dict()`.

An engine fault never costs a prompt (frlab.rollout.pool.requeue): a rollout the engine
failed sends its prompt (its whole group) back into the data order, to run again from its
start, at most `max_prompt_retries` times; so in sync mode a batch holds the same prompts
with or without an outage. While the engine reports an outage (`Engine.outage()`: no server
of a fleet healthy) the pool admits nothing and looks again every OUTAGE_POLL_S; the outage
is timed and told once (frlab.rollout.pool.outages).

The checkpoint (`state_dict`, `load_state_dict`): the data cursor (prompt counter, RNG and
task-sampler state), the prompts not yet finished or requeued (rerun on resume, in prompt
order) with their requeue counts, the finished-but-unconsumed trajectories
(frlab.rollout.pool.rollouts), the learner's versions, the counters and the outage totals;
plain Python values only, so a checkpoint loads with `torch.load(weights_only=True)`. Loading
into a running pool first cancels its in-flight work on the loop thread, with admission held
until the state is in place.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from envs.base import TaskSampler
from frlab.data.batch import Trajectory
from frlab.rollout.agent_loop import AgentLoopConfig
from frlab.rollout.engine import Engine, EngineDown
from frlab.rollout.env_threads import EnvThreads
from frlab.rollout.pool.admission import DeadlineQueue
from frlab.rollout.pool.lockstep import LockstepClient, LockstepGate
from frlab.rollout.pool.loop_thread import STOP_WAIT_S, LoopThread, run_bounded
from frlab.rollout.pool.metering import GenerationMeter, MeteredEngine
from frlab.rollout.pool.outages import OutageWatch
from frlab.rollout.pool.pinning import WeightPins
from frlab.rollout.pool.requeue import EXHAUSTED, RequeueCounts, is_engine_fault
from frlab.rollout.pool.rollouts import (
    Failure,
    Group,
    Rollout,
    check_state,
    close_env,
    ready_record,
    restore_ready,
    run_rollout,
)
from frlab.rollout.pool.state import PoolCounters, PromptCursor, engine_stats
from frlab.rollout.seeding import rollout_seed

log = logging.getLogger(__name__)

OUTAGE_POLL_S = 0.5  # during an engine outage the pool looks again this often


class RolloutPool:
    """Runs rollouts in the background and hands out batches of B finished trajectories.

    `env_factory` builds one environment per rollout; `task_sampler` draws each new prompt's
    task (the env class's `task_sampler(**env_kwargs)`, envs.base); the pool closes it when it
    stops. `off_policy_correction` is the objective's (`Objective.uses_off_policy_correction`):
    when True, `loop_cfg.sampling` must keep the full support (top_p=1, top_k=0) or
    ValueError. The pool sizes, mode and lag bound are the `rollout` keys (declared and checked
    in frlab.config.schema, never defaulted here: `max_prompt_retries` too); `seed` the
    run's."""

    def __init__(
        self,
        engine: Engine,
        env_factory: Callable[[], Any],
        tokenizer: Any,
        loop_cfg: AgentLoopConfig,
        *,
        task_sampler: TaskSampler,
        batch_size: int,
        max_in_flight: int,
        max_policy_lag: int,
        mode: str,
        samples_per_prompt: int,
        max_prompt_retries: int,
        seed: int,
        off_policy_correction: bool,
        num_env_workers: int = 4,
        prompt_id_offset: int = 0,
        prompt_id_stride: int = 1,
    ) -> None:
        if int(num_env_workers) < 1 or not 0 <= int(prompt_id_offset) < int(prompt_id_stride):
            raise ValueError("need num_env_workers >= 1 and 0 <= prompt_id_offset < stride")
        # Importance ratios need the full sampling support (truncation biases them): refuse
        # top-p / top-k here too, so pools built outside train.py (benches, scripts) cannot.
        loop_cfg.sampling.validate(off_policy_correction)
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
        self._cond = threading.Condition()
        self._seed = int(seed)
        self._cursor = PromptCursor(task_sampler, self._seed, prompt_id_offset, prompt_id_stride)
        self._learner_version = self._next_consume_version = 0
        self._reset_queues()
        self._stats = PoolCounters()
        self._requeues = RequeueCounts(max_prompt_retries)
        self._outages = OutageWatch()
        self._started = self._stopping = self._stopped = self._loading = False
        self._error: BaseException | None = None
        self._runner = LoopThread(self._tick, self._crashed)
        self._executor: EnvThreads | None = None
        self._gate: LockstepGate | None = None  # sync mode: deterministic engine batches
        self._meter = GenerationMeter()
        self._metered = MeteredEngine(engine, self._meter)
        self._generation: dict[str, float] = {}
        self._admission_closed = False
        self._waiting = 0  # next_batch calls waiting for a batch now
        self.pins = WeightPins()

    def _reset_queues(self) -> None:
        self._queue = DeadlineQueue()  # started, not yet consumed or dropped
        self._sync_need = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine, the env threads and the event-loop thread (idempotent)."""
        with self._cond:
            if self._stopped or self._stopping:
                raise RuntimeError("RolloutPool was stopped; build a new pool")
            if self._started:
                return
            self._started = True
        self.engine.start()
        self._executor = EnvThreads(self.num_env_workers)
        if self.mode == "sync":
            self._gate = LockstepGate(self._metered, self._runner.wake_in_loop)
        self._runner.start()

    def stop(self) -> None:
        """Cancel in-flight work; stop the loop thread and the engine, close envs; each wait is
        bounded by STOP_WAIT_S and hung environment threads are abandoned (idempotent)."""
        with self._cond:
            if self._stopped or self._stopping:
                return
            self._stopping = True
            self._cond.notify_all()
        try:
            self._runner.stop(STOP_WAIT_S)
        finally:
            try:
                if self._started:
                    run_bounded(self.engine.shutdown, "engine shutdown", STOP_WAIT_S)
            finally:
                self.pins.shutdown(STOP_WAIT_S)
                if self._executor is not None:
                    self._executor.shutdown(wait=True, timeout=STOP_WAIT_S)
                sampler = self._cursor.sampler
                run_bounded(
                    functools.partial(close_env, sampler), "task sampler close", STOP_WAIT_S
                )
                with self._cond:
                    self._stopped = True
                    self._cond.notify_all()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the engine's requests run on (evaluation runs there too)."""
        return self._runner.loop

    def _crashed(self, exc: BaseException) -> None:
        with self._cond:
            self._error = exc
            self._cond.notify_all()

    def _tick(self) -> None:
        """One round of the loop: admit new work, then (sync mode) release the lockstep gate,
        so rollouts admitted in this round count as live before the next engine batch."""
        self._admit()
        if self._gate is not None:
            self._gate.release()

    # -- admission and rollouts (loop thread) ------------------------------------------------
    def _admit(self) -> None:
        g = self.samples_per_prompt
        with self._cond:
            while not (self._stopping or self._loading or self._admission_closed):
                if self.engine.down_reason() is not None:
                    return  # nothing could run: next_batch stops the run (EngineDown)
                if self._in_outage():
                    return  # the circuit breaker: nothing is admitted until it is back
                if self._queue.in_flight() + g > self.max_in_flight or (
                    self.mode == "sync" and self._sync_need <= 0
                ):
                    return
                version = int(self.engine.version)
                due = version + self.max_policy_lag
                if not self._queue.admits(due, g, self._next_consume_version, self.batch_size):
                    self._stats.counts["paused_for_lag"] += not self._stats.lag_paused
                    self._stats.lag_paused = True
                    return
                self._stats.lag_paused = False
                self._launch_group(version, due)

    def _launch_group(self, version: int, due: int) -> None:
        prompt_id, task = self._cursor.next()
        group = Group(prompt_id, task, unresolved=self.samples_per_prompt)
        for _ in range(self.samples_per_prompt):
            ro = self._queue.add(group, version, due)
            client = None if self._gate is None else self._gate.client(ro.seq)
            self._runner.spawn(self._run(ro, client))
        self._stats.counts["started"] += self.samples_per_prompt
        self._sync_need -= self.mode == "sync"

    async def _run(self, ro: Rollout, client: LockstepClient | None) -> None:
        assert self._executor is not None
        engine = self._metered if client is None else client
        group = ro.group
        seed = rollout_seed(self._seed, group.prompt_id, group.members.index(ro), ro.start_version)
        args = (engine, self.env_factory, self.tokenizer, self.loop_cfg, group, self._executor)
        try:
            await run_rollout(*args, functools.partial(self._resolve, ro), seed=seed)
        finally:
            if client is not None:
                client.close()

    def _in_outage(self) -> bool:
        """Follow the engine's outage (frlab.rollout.pool.outages); while it lasts, look again
        every OUTAGE_POLL_S (nothing else wakes the loop then: no rollout runs)."""
        outage = self.engine.outage()
        self._outages.observe(outage, len(self._cursor.pending))
        if outage is not None:
            self._runner.wake_later(OUTAGE_POLL_S)
        return outage is not None

    def _resolve(self, ro: Rollout, traj: Trajectory | None, failure: Failure | None) -> None:
        with self._cond:
            group = ro.group
            group.unresolved -= 1
            if failure is not None:
                self._fail(ro, failure)
            else:
                assert traj is not None
                self._queue.finish(ro, traj)
                self._stats.counts["finished"] += 1
            if group.unresolved == 0:
                self._close_group(group)
            self._cond.notify_all()
        self._runner.wake_in_loop()

    def _fail(self, ro: Rollout, failure: Failure) -> None:
        """A failed sample fails its group: requeued when the engine failed it
        (frlab.rollout.pool.requeue: logged at debug level, the outage is told once), else
        counted and logged as the prompt's own."""
        kind, reason, exc = failure
        group = ro.group
        self._queue.drop(ro)
        group.failed = True
        if is_engine_fault(failure, self.engine):
            self._in_outage()  # an outage is told before the prompts it requeues
            group.requeue, group.faults = group.requeue or reason, group.faults + 1
            log.debug("rollout of prompt %d: engine fault (%s): %s", group.prompt_id, reason, exc)
            return
        group.own_fault = True
        self._stats.count_failure(kind, reason)
        # a call given up at its deadline while the learner waited for a batch
        self._stats.counts["straggler_stalls"] += reason.endswith("_timeout") and bool(
            self._waiting
        )
        log.warning("rollout of prompt %d %s (%s): %s", group.prompt_id, kind, reason, exc)

    def _close_group(self, group: Group) -> None:
        dropped = self._queue.close_group(group)  # the finished siblings of a failed sample
        if group.reruns() and group.failed:
            self._requeue(group)
        else:
            self._requeues.forget(group.prompt_id)
            if dropped:
                self._stats.rejected["incomplete_group"] += dropped
        if group.failed:
            self._sync_need += self.mode == "sync"  # start a replacement (or the same) group

    def _requeue(self, group: Group) -> None:
        """Run the prompt of a group the engine failed again, unless it ran out of retries."""
        assert group.requeue is not None
        if self._requeues.take(group.prompt_id):
            self._cursor.put_back(group.prompt_id, group.task)
            self._stats.requeued[group.requeue] += 1
            self._outages.requeued_one()
            return
        self._stats.count_failure("failed", EXHAUSTED)
        self._stats.failed[EXHAUSTED] += group.faults - 1  # one per failed sample
        retries = self._requeues.max_retries
        log.warning(
            "prompt %d dropped: the engine failed it %d times (rollout.max_prompt_retries=%d), "
            "last for %s",
            group.prompt_id,
            retries + 1,
            retries,
            group.requeue,
        )

    def outage_s(self) -> float | None:
        """How long the engine's outage under way has lasted (None: it serves); cheap, for a
        progress display (safe from any thread)."""
        with self._cond:
            return self._outages.down_s()

    def stats(self) -> dict[str, Any]:
        """Counters and gauges (a consistent snapshot; safe from any thread)."""
        with self._cond:
            out = self._stats.snapshot()
            out.update(
                in_flight=self._queue.in_flight(),
                queued=len(self._queue.ready),
                outstanding=len(self._queue.outstanding),
                lag_paused=out.pop("lag_paused"),
                lag_max_seen=out.pop("lag_max_seen"),
                prompts=self._cursor.counter,
                learner_version=self._learner_version,
                next_consume_version=self._next_consume_version,
                engine_version=int(self.engine.version),
                engine=engine_stats(self.engine),
                generation=dict(self._generation),
                outages=self._outages.totals(),
                fleet_down_s=self._outages.totals()["total_s"],
                fleet_down=self._outages.current is not None,
                **self.loop_cfg.deadlines.stats(),
            )
            return out

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
                self._raise_if_engine_down(None)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(
                        f"no batch of {self.batch_size} in {timeout}s: {self.stats()}"
                    )
                held, since = len(self._queue.ready) >= self.batch_size, time.monotonic()
                if self._outages.current is not None:  # nothing may notify: look again soon
                    left = OUTAGE_POLL_S if left is None else min(left, OUTAGE_POLL_S)
                self._waiting += 1
                try:
                    self._cond.wait(left)
                finally:
                    self._waiting -= 1
                lag_wait += (time.monotonic() - since) if held else 0.0
            batch = self._hand_out(chosen)
            self._generation = self._meter.take_window(time.monotonic() - called, lag_wait)
        self._runner.wake()
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
            self._runner.wake()

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

    def _raise_if_engine_down(self, cause: BaseException | None) -> None:
        """EngineDown when the engine says it can serve nothing more (no batch is ready, or a
        weight push failed: `cause`)."""
        down = self.engine.down_reason()
        if down is not None:
            raise EngineDown(f"the rollout engine is down: {down}") from cause

    def _hand_out(self, chosen: list[Rollout]) -> list[Trajectory]:
        batch = self._queue.hand_out(chosen, self._next_consume_version, self.mode == "sync")
        self._stats.count_batch(batch, self.max_policy_lag)
        self._next_consume_version += 1
        return batch

    # -- versions and weights in -------------------------------------------------------------
    def set_learner_version(self, version: int) -> None:
        """The learner has completed `version` optimizer steps; its next batch trains at >= it."""
        with self._cond:
            self._learner_version = int(version)
            self._next_consume_version = max(self._next_consume_version, int(version))
            self._cond.notify_all()
        self._runner.wake()

    def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Push learner weights at `version` to the engine (it pauses, loads, bumps, resumes)."""
        if int(version) < int(self.engine.version):
            raise ValueError(f"update_weights version {version} < engine {self.engine.version}")
        self.pins.wait()  # an evaluation in flight measures the current weights
        try:
            self.engine.update_weights(state_dict, int(version))
        except Exception as exc:
            self._raise_if_engine_down(exc)  # the learner step is done: a safe point to stop at
            raise
        if int(self.engine.version) != int(version):
            raise RuntimeError(
                f"engine reports version {self.engine.version} after update_weights({version}): "
                "the weights were not applied"
            )
        self._stats.counts["weight_syncs"] += 1
        self.set_learner_version(version)

    # -- checkpoint ----------------------------------------------------------------------------
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
                "requeues": self._requeues.records(),
                "outages": self._outages.totals(),
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
            self._requeues.restore(state.get("requeues"))
            self._outages.restore(state.get("outages"))
            self._cond.notify_all()
