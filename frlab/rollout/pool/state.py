"""What the rollout pool remembers besides its queue: the prompt cursor and the counters.

`PromptCursor` says which prompt the pool runs next: prompts to rerun first (those a checkpoint
recorded as unfinished), then new tasks drawn from the run's task sampler (envs.base.TaskSampler)
with the pool's RNG, numbered `offset`, `offset + stride`, ... (one id stream per rank). Its
checkpoint form is the prompt counter, the RNG state, the prompts to rerun and the sampler's
own state, so a resumed run draws exactly the tasks the uninterrupted run would have.
`PoolCounters` holds the run totals behind `RolloutPool.stats()`; they travel with the
checkpoint, so after a resume they cover the whole run. The record formats are in
`frlab.rollout.pool.rollouts`. Neither class locks: the pool calls them under its own lock.
"""

from __future__ import annotations

import bisect
import random
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from envs.base import TaskSampler
from frlab.rollout.pool.rollouts import (
    Rollout,
    as_rng_state,
    counter_records,
    pending_records,
    restore_counters,
)

COUNTERS = (
    "started",
    "finished",
    "consumed",
    "batches",
    "paused_for_lag",
    "lag_violations",
    "weight_syncs",
    "straggler_stalls",
)


class PromptCursor:
    """The next prompt: a rerun from the checkpoint, else a new task from `sampler`."""

    def __init__(self, sampler: TaskSampler, seed: int, offset: int = 0, stride: int = 1) -> None:
        if not callable(getattr(sampler, "sample", None)):
            raise TypeError(
                f"task_sampler must be a TaskSampler (envs.base), got {type(sampler).__name__}: "
                "build one with the env class's task_sampler(**env_kwargs)"
            )
        self.sampler = sampler
        self.rng = random.Random(seed)
        self.offset, self.stride = int(offset), int(stride)
        self.counter = 0  # new prompts drawn so far
        self.pending: deque[tuple[int, dict[str, Any]]] = deque()

    def next(self) -> tuple[int, dict[str, Any]]:
        """(prompt id, task) of the next prompt to run."""
        if self.pending:
            return self.pending.popleft()
        prompt_id = self.offset + self.counter * self.stride
        self.counter += 1
        return prompt_id, dict(self.sampler.sample(self.rng))

    def put_back(self, prompt_id: int, task: dict[str, Any]) -> None:
        """Run a prompt again, in its place in the data order: before every prompt to run with
        a larger id (ids grow in the order prompts are drawn)."""
        ids = [p for p, _ in self.pending]
        self.pending.insert(bisect.bisect(ids, int(prompt_id)), (int(prompt_id), task))

    def state_dict(self, outstanding: Iterable[Rollout], ready: Iterable[Rollout]) -> dict:
        """Checkpoint form; the unfinished groups among `outstanding` rerun on resume."""
        return {
            "prompt_counter": self.counter,
            "rng_state": self.rng.getstate(),
            "pending": pending_records(self.pending, outstanding, ready),
            "task_sampler": self.sampler.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()`; a checkpoint without sampler state starts the sampler
        afresh (`load_state_dict({})`)."""
        self.counter = int(state["prompt_counter"])
        self.rng.setstate(as_rng_state(state["rng_state"]))
        pending = [(int(p["prompt_id"]), dict(p["task"])) for p in state["pending"]]
        self.pending = deque(sorted(pending, key=lambda item: item[0]))  # the data order
        self.sampler.load_state_dict(dict(state.get("task_sampler") or {}))


@dataclass
class PoolCounters:
    """Run totals (`COUNTERS`, failures and rejections by reason) and the lag gauges."""

    counts: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    requeued: Counter[str] = field(default_factory=Counter)  # prompts run again, by reason
    lag_paused: bool = False
    lag_max_seen: int = 0

    def count_batch(self, batch: list[Any], max_policy_lag: int) -> None:
        """A handed-out batch of lag-annotated trajectories: its lags and its size."""
        for traj in batch:
            lag = traj.info["policy_lag_max"]
            self.lag_max_seen = max(self.lag_max_seen, lag)
            self.counts["lag_violations"] += lag > max_policy_lag
        self.counts["consumed"] += len(batch)
        self.counts["batches"] += 1

    def count_failure(self, kind: str, reason: str) -> None:
        """One rollout "failed" or "rejected" for `reason`."""
        (self.failed if kind == "failed" else self.rejected)[reason] += 1

    def snapshot(self) -> dict[str, Any]:
        """The counter part of `RolloutPool.stats()`."""
        out: dict[str, Any] = {k: self.counts[k] for k in COUNTERS}
        out.update(
            failed=sum(self.failed.values()),
            failed_by_reason=dict(self.failed),
            rejected=sum(self.rejected.values()),
            rejected_by_reason=dict(self.rejected),
            requeued=sum(self.requeued.values()),
            requeued_by_reason=dict(self.requeued),
            lag_paused=self.lag_paused,
            lag_max_seen=self.lag_max_seen,
        )
        return out

    def records(self) -> list[dict[str, int]]:
        """Checkpoint form of the totals."""
        return counter_records(self.counts, self.failed, self.rejected, self.requeued)

    def restore(self, records: Any) -> None:
        """Inverse of `records` (a checkpoint without counters leaves them at zero)."""
        restore_counters(records, self.counts, self.failed, self.rejected, self.requeued)


def engine_stats(engine: Any) -> dict[str, Any]:
    """The engine's own counters (remote: retries, servers_healthy, ...); {} if it has none."""
    stats = getattr(engine, "stats", None)
    return dict(stats()) if callable(stats) else {}
