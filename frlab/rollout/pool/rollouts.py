"""What the rollout pool records: each rollout, its outcome and its checkpoint form.

A `Rollout` is one sample in flight or finished, with the learner version `due` by which it must
be consumed (the policy-lag bound, see `frlab.rollout.pool.admission`); a `Group` is the G samples
of
one prompt (`rollout.samples_per_prompt`; G = 1 for one rollout per prompt). `run_rollout`
plays one sample in a fresh env and reports its
outcome: a trajectory, or a failure classified as "failed" or "rejected" with a reason the pool
counts (never raised: one bad rollout must not stop the run). The checkpoint form of the pool's
data cursor is plain Python values only (so it loads with `torch.load(weights_only=True)`):
prompts not yet finished, to be rerun on resume, and finished-but-unconsumed trajectories with
their start version, and the pool's counters (so run totals survive a resume).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import dataclasses
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from frlab.data.batch import Trajectory
from frlab.rollout.agent_loop import AgentLoopConfig, RolloutError, run_episode
from frlab.rollout.engine import Engine
from frlab.rollout.env_threads import DeadlineExceeded, call_with_deadline

log = logging.getLogger(__name__)

REJECT_REASONS = frozenset({"zero_action_tokens", "bad_trajectory"})
STATE_KEYS = frozenset({"prompt_counter", "rng_state", "pending", "ready"})


@dataclass(eq=False)
class Group:
    """The G samples of one prompt (G = 1: one rollout per prompt). A failed sample fails the
    group; when every failure was the engine's (`requeue`: the first one's reason, `faults`
    of them) and none the prompt's own (`own_fault`), the prompt runs again whole."""

    prompt_id: int
    task: dict[str, Any]
    members: list[Rollout] = field(default_factory=list)
    unresolved: int = 0
    failed: bool = False
    requeue: str | None = None
    faults: int = 0
    own_fault: bool = False

    def reruns(self) -> bool:
        """Whether the prompt is to run (again): not failed, or failed by the engine only."""
        return not self.failed or (self.requeue is not None and not self.own_fault)


@dataclass(eq=False)
class Rollout:
    """One sample: started at engine version `start_version`, consumed by learner version `due`."""

    seq: int
    group: Group
    start_version: int
    due: int
    trajectory: Trajectory | None = None
    finish_seq: int = -1


Failure = tuple[str, str, Exception]  # ("failed" | "rejected", reason, exception)


async def run_rollout(
    engine: Engine,
    env_factory: Callable[[], Any],
    tokenizer: Any,
    loop_cfg: AgentLoopConfig,
    group: Group,
    executor: concurrent.futures.Executor,
    resolve: Callable[[Trajectory | None, Failure | None], None],
    *,
    seed: int | None = None,
) -> None:
    """Play one sample of `group` in a fresh env built on `executor` (under the env deadline),
    pass its outcome to `resolve`, then close the env (also when cancelled). `seed`: the
    rollout's sampling seed (frlab.rollout.seeding), None for the engine's own stream."""
    built, deadline = _BuiltEnv(env_factory), loop_cfg.deadlines.env
    try:
        env = await call_with_deadline(
            executor, deadline.current(), "env_factory", built, observe=deadline.observe
        )
    except asyncio.CancelledError:
        built.give_up(executor)
        raise
    except DeadlineExceeded as exc:
        built.give_up(executor)
        resolve(None, ("failed", "env_factory_timeout", exc))
        return
    except Exception as exc:
        resolve(None, ("failed", "env_factory", exc))
        return
    try:
        traj = await run_episode(
            engine,
            env,
            copy.deepcopy(group.task),
            tokenizer,
            loop_cfg,
            prompt_id=group.prompt_id,
            executor=executor,
            seed=seed,
        )
        if not isinstance(traj, Trajectory):
            raise TypeError(f"episode returned {type(traj).__name__}, not Trajectory")
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        resolve(None, classify_failure(exc))
    else:
        resolve(traj, None)
    finally:
        close_later(executor, env)


class _BuiltEnv:
    """Builds one env; an env finished after its rollout gave up on it is closed, not leaked."""

    def __init__(self, env_factory: Callable[[], Any]) -> None:
        self.env_factory = env_factory
        self.lock = threading.Lock()
        self.env: Any = None
        self.abandoned = False

    def __call__(self) -> Any:
        env = self.env_factory()
        with self.lock:
            if self.abandoned:
                close_env(env)
                return None
            self.env = env
        return env

    def give_up(self, executor: concurrent.futures.Executor) -> None:
        with self.lock:
            self.abandoned = True
            env, self.env = self.env, None
        if env is not None:
            close_later(executor, env)


def close_later(executor: concurrent.futures.Executor, env: Any) -> None:
    """Close `env` on `executor` without waiting (a hung close costs a thread, not the pool)."""
    try:
        executor.submit(close_env, env)
    except RuntimeError:  # executor already shut down
        close_env(env)


def close_env(env: Any) -> None:
    """`env.close()` if it has one; a failure is logged, never raised."""
    try:
        getattr(env, "close", lambda: None)()
    except Exception:  # closing must never fail the run
        log.exception("env.close() failed")


def classify_failure(exc: Exception) -> Failure:
    """("failed" | "rejected", reason, exc) for a rollout that raised."""
    if isinstance(exc, RolloutError):
        return ("rejected" if exc.reason in REJECT_REASONS else "failed"), exc.reason, exc
    return "failed", f"agent_loop:{type(exc).__name__}", exc


def ready_record(ro: Rollout) -> dict[str, Any]:
    """Checkpoint form of a finished, unconsumed rollout."""
    assert ro.trajectory is not None
    return {
        "trajectory": dataclasses.asdict(ro.trajectory),
        "start_version": ro.start_version,
        "task": copy.deepcopy(ro.group.task),
    }


def pending_records(
    pending: Iterable[tuple[int, dict[str, Any]]],
    outstanding: Iterable[Rollout],
    ready: Iterable[Rollout],
) -> list[dict[str, Any]]:
    """Checkpoint form of the prompts to rerun: queued ones, then groups still running."""
    ready_ids = {id(ro) for ro in ready}
    unfinished = {
        id(ro.group): ro.group
        for ro in outstanding
        if ro.group.reruns() and id(ro) not in ready_ids
    }
    prompts = [*pending, *((g.prompt_id, g.task) for g in unfinished.values())]
    return [{"prompt_id": p, "task": copy.deepcopy(t)} for p, t in prompts]


def check_state(state: Mapping[str, Any]) -> None:
    """Raise KeyError naming the fields a RolloutPool state lacks."""
    missing = STATE_KEYS - set(state)
    if missing:
        raise KeyError(f"RolloutPool state is missing {sorted(missing)}")


def restore_ready(items: Iterable[Mapping[str, Any]], max_policy_lag: int) -> Iterator[Rollout]:
    """Finished rollouts from their checkpoint form, numbered 0.. in order (seq = finish_seq);
    the samples of one prompt started at one version form one group again."""
    groups: dict[tuple[int, int], Group] = {}
    for i, item in enumerate(items):
        traj, start = Trajectory(**item["trajectory"]), int(item["start_version"])
        key = (int(traj.prompt_id), start)
        if key not in groups:
            groups[key] = Group(traj.prompt_id, dict(item.get("task", {})))
        group = groups[key]
        ro = Rollout(i, group, start, start + max_policy_lag, traj, finish_seq=i)
        group.members.append(ro)
        yield ro


def counter_records(*counters: Counter[str]) -> list[dict[str, int]]:
    """Checkpoint form of the pool's counters (plain dicts), so totals survive a resume."""
    return [{str(k): int(v) for k, v in c.items()} for c in counters]


def restore_counters(records: Any, *counters: Counter[str]) -> None:
    """Inverse of `counter_records`; a checkpoint without counters (or written before a
    counter existed) leaves them at zero."""
    records = list(records or [])
    records += [{}] * (len(counters) - len(records))
    for counter, record in zip(counters, records, strict=True):
        counter.clear()
        counter.update({str(k): int(v) for k, v in dict(record).items()})


def as_rng_state(state: Any) -> tuple:
    """random.Random state from its tuple form (or the list form a JSON round-trip gives)."""
    version, internal, gauss = state
    return (int(version), tuple(int(x) for x in internal), gauss)
