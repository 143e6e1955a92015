"""Admission control for the rollout pool: the deadline maths that bounds policy lag.

FlashREINFORCE (paper, Sec. 3) never drops a finished trajectory for being slow (that would
bias training toward short rollouts); staleness is bounded by ADMISSION CONTROL instead.

Lag bookkeeping. Learner version L = optimizer steps completed; the batch handed out next is
trained at `next_consume_version` (one batch = one optimizer step). A rollout admitted while
the engine is at version E samples tokens of version >= E, so it must be consumed by learner
version `due = E + max_policy_lag`. The pool keeps the earliest-deadline invariant

    for every d >= L:  #{outstanding rollouts with due <= d} <= (d - L + 1) * B,

admits new work only if the invariant still holds with it (`admission_feasible`; otherwise it
pauses, counted in `paused_for_lag`), and builds each batch from finished rollouts
(`select_batch`): first the earliest-due ones the invariant requires (`required_early`; waiting
for them if they are still running), the rest in finish order. So every trajectory satisfies
`learner_version - min token version <= max_policy_lag` at consumption, and the per-trajectory
lag (`lag_info`) is written into `Trajectory.info`. `DeadlineQueue` holds the outstanding
rollouts these counts are over.

Groups (G = `rollout.samples_per_prompt` > 1, group baselines such as GRPO): the G samples of a
prompt are admitted together with one deadline, and a batch is built from whole groups only
(`select_batch` takes groups as units, the earliest-due first, then in the order they
completed), in the asynchronous mode as in the synchronous one. B is a multiple of G and every
group's members share their due, so the counts of the invariant stay multiples of G and the
lag bound holds for every member. A group with a failed sample is dropped whole.
"""

from __future__ import annotations

from collections.abc import Iterable

from frlab.data.batch import Trajectory
from frlab.rollout.pool.rollouts import Group, Rollout


def admission_feasible(
    dues: list[int], new_due: int, new_count: int, learner_version: int, batch_size: int
) -> bool:
    """Whether `new_count` rollouts due at `new_due` keep the earliest-deadline invariant."""
    if new_due < learner_version:
        return False
    for d in sorted({x for x in dues if x >= new_due} | {new_due}):
        count = sum(1 for x in dues if x <= d) + new_count
        if count > (d - learner_version + 1) * batch_size:
            return False
    return True


def required_early(dues: list[int], learner_version: int, batch_size: int) -> dict[int, int]:
    """For each due d: how many rollouts with due <= d the next batch must contain."""
    need: dict[int, int] = {}
    for d in sorted(set(dues)):
        excess = sum(1 for x in dues if x <= d) - (d - learner_version) * batch_size
        if excess > 0:
            need[d] = excess
    return need


def group_units(ready: list[Rollout]) -> list[list[Rollout]]:
    """The finished rollouts as whole groups, in the order the groups completed (a group
    completes with its last member; G = 1: one rollout per unit, in finish order)."""
    units: dict[int, list[Rollout]] = {}
    for ro in ready:
        units.setdefault(id(ro.group), []).append(ro)
    done = [sorted(unit, key=lambda ro: ro.finish_seq) for unit in units.values()]
    return sorted(done, key=lambda unit: unit[-1].finish_seq)


def select_batch(
    ready: list[Rollout], dues: list[int], learner_version: int, batch_size: int
) -> list[Rollout] | None:
    """B finished rollouts, whole groups only, that keep every deadline, else None (wait for
    more to finish)."""
    if len(ready) < batch_size:
        return None
    need = required_early(dues, learner_version, batch_size)
    for d, n in need.items():
        if sum(1 for ro in ready if ro.due <= d) < min(n, batch_size):
            return None
    n_early = min(batch_size, max(need.values(), default=0))
    units = group_units(ready)
    chosen: list[list[Rollout]] = []
    count = 0
    for unit in sorted(units, key=lambda u: (u[0].due, u[-1].finish_seq)):  # earliest due first
        if count >= n_early:
            break
        if count + len(unit) <= batch_size:
            chosen.append(unit)
            count += len(unit)
    for unit in units:  # the rest in completion order
        if count + len(unit) <= batch_size and not any(unit is c for c in chosen):
            chosen.append(unit)
            count += len(unit)
    if count < batch_size:
        return None
    return [ro for unit in sorted(chosen, key=lambda u: u[-1].finish_seq) for ro in unit]


def lag_info(learner_version: int, start_version: int, traj: Trajectory) -> dict[str, int]:
    """The policy lag of a trajectory consumed at `learner_version`, for `Trajectory.info`."""
    return {
        "learner_version": learner_version,
        "start_version": start_version,
        "min_version": traj.min_version,
        "max_version": traj.max_version,
        "policy_lag_min": learner_version - traj.max_version,
        "policy_lag_max": learner_version - traj.min_version,
    }


class DeadlineQueue:
    """The rollouts a pool has started and not yet handed out or dropped, with their deadlines.

    `outstanding` maps seq -> rollout, running or finished; `ready` holds the finished rollouts
    of complete groups in finish order. Every count in the invariant is over `outstanding`.
    """

    def __init__(self) -> None:
        self.outstanding: dict[int, Rollout] = {}
        self.ready: list[Rollout] = []
        self.seq = self.finish_seq = 0

    def in_flight(self) -> int:
        return sum(ro.trajectory is None for ro in self.outstanding.values())

    def dues(self) -> list[int]:
        return [ro.due for ro in self.outstanding.values()]

    def num_groups(self) -> int:
        return len({id(ro.group) for ro in self.outstanding.values()})

    def admits(self, due: int, count: int, learner_version: int, batch_size: int) -> bool:
        """Whether `count` more rollouts due at `due` keep the invariant."""
        return admission_feasible(self.dues(), due, count, learner_version, batch_size)

    def add(self, group: Group, start_version: int, due: int) -> Rollout:
        """A new running rollout of `group`."""
        ro = Rollout(self.seq, group, start_version, due)
        self.seq += 1
        group.members.append(ro)
        self.outstanding[ro.seq] = ro
        return ro

    def finish(self, ro: Rollout, trajectory: Trajectory) -> None:
        ro.trajectory, ro.finish_seq = trajectory, self.finish_seq
        self.finish_seq += 1

    def drop(self, ro: Rollout) -> None:
        self.outstanding.pop(ro.seq, None)

    def close_group(self, group: Group) -> int:
        """Queue a resolved group's finished rollouts, or, if one of its samples failed, drop
        them (a group is atomic); returns how many finished rollouts were dropped."""
        done = [ro for ro in group.members if ro.trajectory is not None]
        if not group.failed:
            self.ready.extend(sorted(done, key=lambda ro: ro.finish_seq))
            return 0
        for ro in done:
            self.drop(ro)
        return len(done)

    def select(self, learner_version: int, batch_size: int) -> list[Rollout] | None:
        """The next batch (`select_batch`), or None if it must wait for more to finish."""
        return select_batch(self.ready, self.dues(), learner_version, batch_size)

    def take(self, chosen: list[Rollout]) -> None:
        """Remove a handed-out batch from the queue."""
        taken = {id(ro) for ro in chosen}
        self.ready = [ro for ro in self.ready if id(ro) not in taken]
        for ro in chosen:
            self.drop(ro)

    def hand_out(self, chosen: list[Rollout], version: int, prompt_order: bool) -> list[Trajectory]:
        """Take a chosen batch out of the queue; its trajectories, each annotated with its lag
        at `version` (`lag_info`), in finish order or, `prompt_order`, in admission order."""
        self.take(chosen)
        if prompt_order:  # sync mode: independent of the timing-dependent finish order, and
            # of requeues (a prompt run again is admitted later under its own id)
            chosen = sorted(chosen, key=lambda ro: (ro.group.prompt_id, ro.seq))
        batch = []
        for ro in chosen:
            assert ro.trajectory is not None
            ro.trajectory.info.update(lag_info(version, ro.start_version, ro.trajectory))
            batch.append(ro.trajectory)
        return batch

    def restore(self, rollouts: Iterable[Rollout]) -> None:
        """Queue finished rollouts read back from a checkpoint (numbered from 0, in order)."""
        for ro in rollouts:
            self.outstanding[ro.seq] = ro
            self.ready.append(ro)
            self.seq = self.finish_seq = ro.seq + 1
