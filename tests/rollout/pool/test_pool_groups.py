"""Group sampling in the asynchronous pool (GRPO as the paper ran it: G samples of a prompt,
the same one-pass asynchronous pipeline): G samples admitted together, batches of whole groups,
the lag bound per member, a failed member fails its group.

A fake engine samples instantly; each sample's environment step waits for its own gate
(task n, member k), so the test chooses the order in which the members of groups finish.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter

import pytest
from helpers.pool import pool_settings

from envs.base import Env, StepResult
from frlab.data.batch import Trajectory
from frlab.defaults import agent_loop_config, sampling_params
from frlab.model.toy_tokenizer import build_toy_tokenizer
from frlab.rollout.engine import Engine, GenerationResult, SamplingParams
from frlab.rollout.pool import RolloutPool
from frlab.rollout.pool.admission import select_batch
from frlab.rollout.pool.rollouts import Group, Rollout, restore_ready

TOKENIZER = build_toy_tokenizer()
LETTER = TOKENIZER.convert_tokens_to_ids("a")


class InstantEngine(Engine):
    """One letter + eos at log-prob -1, tagged with the current version."""

    def __init__(self) -> None:
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    def start(self) -> None: ...

    def shutdown(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams):
        await asyncio.sleep(0)
        ids = [LETTER, TOKENIZER.eos_token_id]
        return GenerationResult(ids, [-1.0, -1.0], [self._version] * 2, "stop")

    def update_weights(self, state_dict, version: int) -> None:
        self._version = int(version)


class Gates:
    """Gate (n, k) for member k (in the order members reach their step) of task n."""

    def __init__(self, open_all: bool = False, fail: set[tuple[int, int]] | None = None) -> None:
        self.lock = threading.Lock()
        self.all_open = open_all
        self.fail = set(fail or ())
        self.tasks = 0
        self.members: Counter[int] = Counter()
        self.events: dict[tuple[int, int], threading.Event] = {}

    def event(self, key: tuple[int, int]) -> threading.Event:
        with self.lock:
            if key not in self.events:
                self.events[key] = threading.Event()
                if self.all_open:
                    self.events[key].set()
            return self.events[key]

    def open(self, *keys: tuple[int, int]) -> None:
        for key in keys:
            self.event(key).set()

    def open_everything(self) -> None:
        with self.lock:
            self.all_open = True
            events = list(self.events.values())
        for e in events:
            e.set()


class MemberEnv(Env):
    """Task n (one per group); a member's step waits for its gate; reward = member index."""

    def __init__(self, gates: Gates) -> None:
        self.gates, self.key = gates, (-1, -1)

    def sample_task(self, rng: random.Random) -> dict:
        with self.gates.lock:
            n, self.gates.tasks = self.gates.tasks, self.gates.tasks + 1
        return {"n": n}

    def reset(self, task) -> list[dict[str, str]]:
        n = int(task["n"])
        with self.gates.lock:
            self.key = (n, self.gates.members[n])
            self.gates.members[n] += 1
        return [{"role": "user", "content": f"task {n}"}]

    def step(self, action_text: str) -> StepResult:
        if self.key in self.gates.fail:
            raise RuntimeError(f"member {self.key} failed")
        if not self.gates.event(self.key).wait(timeout=20):
            raise TimeoutError(f"gate {self.key} never opened")
        return StepResult(None, float(self.key[1]), True, {"key": list(self.key)})


def make_pool(gates: Gates, **kw) -> RolloutPool:
    cfg = agent_loop_config(max_turns=1, max_len=64, sampling=sampling_params(max_new_tokens=4))
    opts = dict(
        batch_size=4, samples_per_prompt=2, max_in_flight=6, max_policy_lag=8, num_env_workers=12
    )
    opts.update(kw)
    tasks = MemberEnv.task_sampler(gates=gates)  # the default: one instance's sample_task
    return RolloutPool(
        InstantEngine(),
        lambda: MemberEnv(gates),
        TOKENIZER,
        cfg,
        task_sampler=tasks,
        **pool_settings(**opts),
    )


def wait_for(pred, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError("condition not reached")
        time.sleep(0.005)


def groups_of(batch: list[Trajectory]) -> Counter[int]:
    return Counter(t.prompt_id for t in batch)


def test_a_batch_never_splits_a_group() -> None:
    gates = Gates()
    pool = make_pool(gates)  # 3 groups of 2 in flight, B = 4
    pool.start()
    try:
        wait_for(lambda: pool.stats()["in_flight"] == 6 and sum(gates.members.values()) == 6)
        # Finish order 0a, 1a, 2a, 0b: the first B finishers would split groups 1 and 2.
        for key in [(0, 0), (1, 0), (2, 0), (0, 1)]:
            gates.open(key)
            wait_for(
                lambda k=key: (
                    pool.stats()["finished"] == [(0, 0), (1, 0), (2, 0), (0, 1)].index(k) + 1
                )
            )
        with pytest.raises(TimeoutError):
            pool.next_batch(timeout=0.3)
        gates.open((1, 1))
        first = pool.next_batch(timeout=10)
        assert groups_of(first) == {0: 2, 1: 2}
        assert sorted(t.info["env"]["key"][1] for t in first) == [0, 0, 1, 1]
        gates.open((2, 1))  # group 2 completes before the groups admitted after it start
        wait_for(lambda: pool.stats()["finished"] == 6)
        gates.open_everything()
        second = pool.next_batch(timeout=10)
        assert set(groups_of(second).values()) == {2} and 2 in groups_of(second)
    finally:
        gates.open_everything()
        pool.stop()


def test_groups_keep_the_lag_bound_for_every_member_and_nothing_is_dropped() -> None:
    gates = Gates()
    rng = random.Random(3)
    stop = threading.Event()

    def opener() -> None:  # members finish in a shuffled, heavy-tailed order
        while not stop.is_set():
            with gates.lock:
                waiting = [k for k, e in gates.events.items() if not e.is_set()]
            if waiting:
                gates.open(rng.choice(sorted(waiting)[:6]))
            time.sleep(0.001)

    pool = make_pool(gates, batch_size=6, samples_per_prompt=3, max_in_flight=12, max_policy_lag=2)
    thread = threading.Thread(target=opener)
    pool.start()
    thread.start()
    lags, seen = [], Counter()
    try:
        for version in range(12):
            batch = pool.next_batch(timeout=20)
            assert set(groups_of(batch).values()) == {3}, groups_of(batch)  # whole groups
            for t in batch:  # each member within the bound, consumed at its own version
                assert t.info["learner_version"] == version
                lags.append(t.info["policy_lag_max"])
            seen.update(groups_of(batch))
            pool.update_weights({}, version + 1)
        stats = pool.stats()
    finally:
        stop.set()
        thread.join()
        gates.open_everything()
        pool.stop()
    assert max(lags) <= 2 and stats["lag_violations"] == 0
    assert len(seen) == 24 and set(seen.values()) == {3}  # 24 distinct prompts, 3 samples each
    assert stats["failed"] == stats["rejected"] == 0
    # every finished sample was handed out, or waits (queued with its group, or for siblings)
    assert stats["finished"] == stats["consumed"] + stats["outstanding"] - stats["in_flight"]


def test_a_failed_member_fails_its_group_as_in_sync_mode() -> None:
    gates = Gates(open_all=True, fail={(0, 1)})
    pool = make_pool(gates, batch_size=4, samples_per_prompt=2, max_in_flight=4)
    pool.start()
    try:
        batch = pool.next_batch(timeout=10)
        stats = pool.stats()
    finally:
        pool.stop()
    assert 0 not in groups_of(batch) and set(groups_of(batch).values()) == {2}
    assert stats["failed_by_reason"] == {"env_step": 1}
    assert stats["rejected_by_reason"] == {"incomplete_group": 1}


def _ro(seq: int, group: Group, due: int, finish: int) -> Rollout:
    traj = Trajectory(
        prompt_id=group.prompt_id,
        token_ids=[1, 2],
        action_mask=[False, True],
        behavior_log_probs=[0.0, -1.0],
        token_versions=[0, 0],
        reward=0.0,
    )
    ro = Rollout(seq, group, 0, due, traj, finish)
    group.members.append(ro)
    return ro


def test_select_batch_takes_the_required_early_groups_whole() -> None:
    """B = 2, learner version 0: two of the four samples due at version 1 must go now. Groups A
    and C are both due at 1, their members finished interleaved (A 2 and 5, C 3 and 4): the
    earliest-due-first choice per rollout would take A's 2 and C's 3."""
    late, a, c = Group(0, {}), Group(1, {}), Group(2, {})
    ready = [
        _ro(0, late, 5, 0),
        _ro(1, late, 5, 1),
        _ro(3, c, 1, 3),
        _ro(4, c, 1, 4),
        _ro(2, a, 1, 2),
        _ro(5, a, 1, 5),
    ]  # groups queue as they complete
    batch = select_batch(ready, [ro.due for ro in ready], learner_version=0, batch_size=2)
    assert batch == [ready[2], ready[3]]  # group C, the first due group to complete
    singles = [_ro(i, Group(i, {}), due, i) for i, due in enumerate([5, 0, 5])]
    picked = select_batch(singles, [5, 0, 5], learner_version=0, batch_size=2)
    assert picked == [singles[0], singles[1]]  # G = 1: the earliest-due one, then finish order


def test_restored_samples_of_a_prompt_form_one_group_again() -> None:
    def record(prompt_id: int, start: int) -> dict:
        traj = Trajectory(
            prompt_id=prompt_id,
            token_ids=[1, 2],
            action_mask=[False, True],
            behavior_log_probs=[0.0, -1.0],
            token_versions=[start] * 2,
            reward=0.0,
        )
        import dataclasses

        return {"trajectory": dataclasses.asdict(traj), "start_version": start, "task": {}}

    restored = list(restore_ready([record(4, 1), record(4, 1), record(5, 1), record(5, 2)], 3))
    assert restored[0].group is restored[1].group and len(restored[0].group.members) == 2
    assert restored[2].group is not restored[3].group  # another start: another group
    assert [ro.due for ro in restored] == [4, 4, 4, 5]
