"""RolloutPool: first-B-finishers, carry-over, admission control, sync groups, failures, stop, resume.

A fake engine samples instantly; a gated fake environment blocks each rollout's step until the
test opens that task's gate, so the order in which rollouts finish is chosen by the test.
"""

from __future__ import annotations

import asyncio
import io
import random
import threading
import time
from collections import Counter

import pytest
import torch

from envs.base import Env, StepResult
from frlab.model.toy_tokenizer import build_toy_tokenizer
from frlab.rollout.agent_loop import AgentLoopConfig
from frlab.rollout.engine import Engine, EngineError, GenerationResult, SamplingParams
from frlab.rollout.pool import RolloutPool, admission_feasible, required_early

TOKENIZER = build_toy_tokenizer()
LETTERS = [TOKENIZER.convert_tokens_to_ids(c) for c in "abcdefgh"]


class FakeEngine(Engine):
    """Samples 2 random letters + eos at log-prob -1; prompts containing "boom" fail."""

    def __init__(self) -> None:
        self._version = 0
        self.started = self.shut_down = False
        self.calls = 0
        self._rng = random.Random(0)

    @property
    def version(self) -> int:
        return self._version

    def start(self) -> None:
        self.started = True

    def shutdown(self) -> None:
        self.shut_down = True

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams
    ) -> GenerationResult:
        await asyncio.sleep(0)
        self.calls += 1
        if "boom" in TOKENIZER.decode(prompt_token_ids):
            raise EngineError("boom")
        ids = [self._rng.choice(LETTERS), self._rng.choice(LETTERS), TOKENIZER.eos_token_id]
        ids = ids[: params.max_new_tokens]
        return GenerationResult(ids, [-1.0] * len(ids), [self._version] * len(ids), "stop")

    def update_weights(self, state_dict, version: int) -> None:
        self._version = int(version)


class Board:
    """Shared test state: task numbering, per-task gates and behaviours."""

    def __init__(self, open_by_default: bool = False, plan: dict[int, str] | None = None) -> None:
        self.open_by_default, self.plan = open_by_default, dict(plan or {})
        self.lock = threading.Lock()
        self.count = 0
        self.gates: dict[int, threading.Event] = {}
        self.attempts: Counter[int] = Counter()
        self.closed_envs = 0
        self.release = threading.Event()

    def gate(self, n: int) -> threading.Event:
        with self.lock:
            if n not in self.gates:
                self.gates[n] = threading.Event()
                if self.open_by_default:
                    self.gates[n].set()
            return self.gates[n]

    def open(self, *ns: int) -> None:
        for n in ns:
            self.gate(n).set()

    def open_all(self) -> None:
        self.open_by_default = True
        with self.lock:
            gates = list(self.gates.values())
        for g in gates:
            g.set()


class GatedEnv(Env):
    """Task n: reset shows it, step waits for gate n, reward n % 2; `plan` injects failures."""

    def __init__(self, board: Board) -> None:
        self.board = board
        self.n, self.x = -1, -1

    def sample_task(self, rng: random.Random) -> dict:
        with self.board.lock:
            n, self.board.count = self.board.count, self.board.count + 1
        return {"n": n, "x": rng.randrange(1000)}

    def reset(self, task) -> list[dict[str, str]]:
        self.n, self.x = int(task["n"]), int(task["x"])
        kind = self.board.plan.get(self.n, "ok")
        text = {"engine_fail": "boom", "zero": "z" * 80}.get(kind, f"task {self.n}")
        return [{"role": "user", "content": text}]

    def step(self, action_text: str) -> StepResult:
        with self.board.lock:
            self.board.attempts[self.n] += 1
            first = self.board.attempts[self.n] == 1
        kind = self.board.plan.get(self.n, "ok")
        if kind == "env_fail" or (kind == "flaky" and first):
            raise RuntimeError(f"env step failed for task {self.n}")
        if kind == "hang":
            self.board.release.wait()  # until the test ends: never within the deadline
        if not self.board.gate(self.n).wait(timeout=20):
            raise TimeoutError(f"gate {self.n} never opened")
        return StepResult(None, float(self.n % 2), True, {"n": self.n, "x": self.x})

    def close(self) -> None:
        with self.board.lock:
            self.board.closed_envs += 1


def make_pool(board: Board, env_timeout_s: float = 300.0, **kw) -> tuple[RolloutPool, FakeEngine]:
    engine = FakeEngine()
    cfg = AgentLoopConfig(max_turns=1, max_len=64, sampling=SamplingParams(max_new_tokens=4),
                          env_timeout_s=env_timeout_s)  # fmt: skip
    opts = dict(batch_size=2, max_in_flight=4, max_policy_lag=8, num_env_workers=8)
    opts.update(kw)
    tasks = GatedEnv.task_sampler(board=board)  # the default: one instance's sample_task
    pool = RolloutPool(engine, lambda: GatedEnv(board), TOKENIZER, cfg, task_sampler=tasks, **opts)
    return pool, engine


@pytest.fixture
def board():
    b = Board()
    yield b
    b.open_all()


def task_ids(batch) -> list[int]:
    return sorted(t.info["env"]["n"] for t in batch)


def wait_for(pred, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError("condition not reached")
        time.sleep(0.005)


def test_first_b_finishers_are_handed_out_and_the_rest_carry_over(board: Board) -> None:
    pool, _ = make_pool(board, batch_size=2, max_in_flight=4)
    pool.start()
    try:
        wait_for(lambda: pool.stats()["in_flight"] == 4)
        board.open(2, 3)
        first = pool.next_batch(timeout=10)
        assert task_ids(first) == [2, 3]
        assert sorted(t.prompt_id for t in first) == [2, 3]
        wait_for(lambda: pool.stats()["started"] == 6)  # refilled to 4 in flight: 0, 1, 4, 5
        board.open(5, 0)
        assert task_ids(pool.next_batch(timeout=10)) == [0, 5]
        wait_for(lambda: pool.stats()["started"] == 8)
        stats = pool.stats()
        assert stats["in_flight"] == 4 and stats["consumed"] == 4  # 1, 4, 6, 7 running
        board.open(1, 6, 7)
        third = pool.next_batch(timeout=10)
        board.open(4)
        fourth = pool.next_batch(timeout=10)
        # the slow ones (1 and 4) finished late but were not dropped
        assert {1, 4} <= set(task_ids(third) + task_ids(fourth))
    finally:
        board.open_all()
        pool.stop()


def test_admission_pauses_at_the_lag_bound_and_batches_wait_for_due_rollouts(board: Board) -> None:
    pool, engine = make_pool(board, batch_size=2, max_in_flight=8, max_policy_lag=1)
    pool.start()
    try:
        wait_for(lambda: pool.stats()["lag_paused"] and engine.calls == 4)
        stats = pool.stats()
        assert stats["started"] == 4 and stats["paused_for_lag"] == 1  # (lag + 1) * B, not 8
        board.open(0, 1)
        assert task_ids(pool.next_batch(timeout=10)) == [0, 1]
        pool.update_weights({}, 1)
        wait_for(lambda: pool.stats()["started"] == 6)
        board.open(4, 5)  # newer rollouts finish while 2 and 3 (due at version 1) still run
        wait_for(lambda: pool.stats()["queued"] == 2)
        with pytest.raises(TimeoutError):
            pool.next_batch(timeout=0.2)  # FIFO would hand out 4, 5 and let 2, 3 go stale
        board.open(2, 3)
        second = pool.next_batch(timeout=10)
        assert task_ids(second) == [2, 3]
        assert [t.info["policy_lag_max"] for t in second] == [1, 1], [t.info for t in second]
        pool.update_weights({}, 2)
        assert task_ids(pool.next_batch(timeout=10)) == [4, 5]
    finally:
        board.open_all()
        pool.stop()


def test_lag_never_exceeds_the_bound_and_nothing_finished_is_dropped() -> None:
    board = Board(open_by_default=False)
    rng = random.Random(1)
    stop = threading.Event()

    def opener() -> None:  # finish rollouts in a shuffled, heavy-tailed order
        while not stop.is_set():
            with board.lock:
                waiting = [
                    n
                    for n in range(board.count)
                    if n not in board.gates or not board.gates[n].is_set()
                ]
            if waiting:
                board.open(rng.choice(waiting[:8]))
            time.sleep(0.001)

    pool, _ = make_pool(board, batch_size=3, max_in_flight=12, max_policy_lag=2)
    thread = threading.Thread(target=opener)
    pool.start()
    thread.start()
    lags, seen = [], []
    try:
        for version in range(15):
            batch = pool.next_batch(timeout=20)
            lags += [t.info["policy_lag_max"] for t in batch]
            seen += [t.prompt_id for t in batch]
            pool.update_weights({}, version + 1)
        stats = pool.stats()
    finally:
        stop.set()
        thread.join()
        board.open_all()
        pool.stop()
    assert max(lags) <= 2 and stats["lag_violations"] == 0
    assert len(seen) == len(set(seen)) == 45
    assert stats["failed"] == stats["rejected"] == 0
    assert stats["finished"] == stats["consumed"] + stats["queued"]


def test_sync_mode_collects_b_over_g_prompts_times_g_and_waits_for_the_next_request() -> None:
    board = Board(open_by_default=True)
    pool, _ = make_pool(board, mode="sync", batch_size=4, samples_per_prompt=2, max_in_flight=8)
    pool.start()
    try:
        first = pool.next_batch(timeout=10)
        assert Counter(t.prompt_id for t in first) == {0: 2, 1: 2}
        time.sleep(0.05)
        assert pool.stats()["started"] == 4  # nothing starts until the next request
        second = pool.next_batch(timeout=10)
        assert Counter(t.prompt_id for t in second) == {2: 2, 3: 2}
    finally:
        pool.stop()


def test_sync_group_with_a_failed_sample_is_replaced_and_counted() -> None:
    board = Board(open_by_default=True, plan={0: "flaky"})
    pool, _ = make_pool(board, mode="sync", batch_size=2, samples_per_prompt=2, max_in_flight=2)
    pool.start()
    try:
        batch = pool.next_batch(timeout=10)
        stats = pool.stats()
    finally:
        pool.stop()
    assert [t.prompt_id for t in batch] == [1, 1]
    assert stats["failed_by_reason"] == {"env_step": 1}
    assert stats["rejected_by_reason"] == {"incomplete_group": 1}


def test_failures_are_counted_by_reason_and_do_not_stop_the_run() -> None:
    board = Board(open_by_default=True, plan={0: "env_fail", 1: "engine_fail", 2: "zero"})
    pool, _ = make_pool(board, batch_size=3, max_in_flight=3)
    pool.start()
    try:
        batch = pool.next_batch(timeout=10)
        stats = pool.stats()
    finally:
        pool.stop()
    assert not {0, 1, 2} & set(task_ids(batch))
    assert stats["failed_by_reason"] == {"env_step": 1, "engine": 1}
    assert stats["rejected_by_reason"] == {"zero_action_tokens": 1}
    assert stats["failed"] == 2 and stats["rejected"] == 1


def test_hung_env_steps_fail_their_rollouts_at_the_deadline_and_the_pool_moves_on() -> None:
    """Before deadlines, one step that never returned held its batch back forever and pool.stop()
    joined the hung thread (SIGINT/SIGTERM could not end the process)."""
    board = Board(open_by_default=True, plan={0: "hang", 3: "hang"})
    pool, _ = make_pool(board, env_timeout_s=0.2, batch_size=2, max_in_flight=4,
                        num_env_workers=2)  # fmt: skip
    pool.start()
    try:
        batches = [pool.next_batch(timeout=60) for _ in range(4)]
        stats = pool.stats()
        stopper = threading.Thread(target=pool.stop)
        stopper.start()
        stopper.join(60)  # a hang detector, not a timing bound
        assert not stopper.is_alive(), "pool.stop() waited for the hung environment threads"
    finally:
        board.release.set()
        pool.stop()
    assert not {0, 3} & {n for b in batches for n in task_ids(b)}
    assert stats["failed_by_reason"] == {"env_step_timeout": 2}
    assert stats["consumed"] == 8


def test_counters_travel_with_the_state_so_run_totals_survive_a_resume() -> None:
    board = Board(open_by_default=True, plan={1: "env_fail"})
    pool, _ = make_pool(board, batch_size=2, max_in_flight=2)
    pool.start()
    try:
        for _ in range(2):
            pool.next_batch(timeout=10)
        state, before = pool.state_dict(), pool.stats()
    finally:
        pool.stop()
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    resumed, _ = make_pool(Board(open_by_default=True), batch_size=2, max_in_flight=2)
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    resumed.start()
    try:
        resumed.next_batch(timeout=10)
        after = resumed.stats()
    finally:
        resumed.stop()
    assert before["failed_by_reason"] == {"env_step": 1} == after["failed_by_reason"]
    assert (before["consumed"], after["consumed"]) == (4, 6)
    assert (before["batches"], after["batches"]) == (2, 3)
    assert after["started"] >= before["started"] + 2


def test_stop_joins_every_thread_even_after_an_exception(board: Board) -> None:
    before = set(threading.enumerate())
    pool, engine = make_pool(board, max_in_flight=4)
    pool.start()
    blocked_error: list[BaseException] = []

    def consumer() -> None:
        try:
            pool.next_batch(timeout=30)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            blocked_error.append(exc)

    waiter = threading.Thread(target=consumer)
    waiter.start()
    with pytest.raises(KeyError):
        try:
            wait_for(lambda: pool.stats()["in_flight"] == 4)
            pool.stats()["no such counter"]  # noqa: B018 - the training loop fails mid-run
        finally:
            board.open_all()
            pool.stop()
    waiter.join(timeout=10)
    pool.stop()  # idempotent
    assert engine.shut_down
    assert isinstance(blocked_error[0], RuntimeError)
    assert set(threading.enumerate()) == before
    with pytest.raises(RuntimeError, match="not running"):
        pool.next_batch(timeout=1)


def test_state_dict_round_trip_resumes_the_prompt_cursor() -> None:
    board = Board(open_by_default=True)
    pool, _ = make_pool(board, batch_size=2, max_in_flight=4)
    pool.start()
    try:
        consumed = [t for _ in range(3) for t in pool.next_batch(timeout=10)]
        state = pool.state_dict()
    finally:
        pool.stop()
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)

    resumed, _ = make_pool(Board(open_by_default=True), batch_size=2, max_in_flight=4)
    resumed.start()  # Lightning restores the datamodule after setup: load into a running pool
    try:
        resumed.load_state_dict(state)
        for _ in range(6):
            consumed += resumed.next_batch(timeout=10)
    finally:
        resumed.stop()
    ids = [t.prompt_id for t in consumed]
    assert len(ids) == len(set(ids))
    assert set(range(state["prompt_counter"])) <= set(ids)  # nothing in flight or queued was lost
    reference = random.Random(0)
    expected_x = [reference.randrange(1000) for _ in range(max(ids) + 1)]
    assert all(t.info["env"]["x"] == expected_x[t.prompt_id] for t in consumed)


def test_stall_is_reported_when_the_engine_never_receives_weights() -> None:
    board = Board(open_by_default=True)
    pool, _ = make_pool(board, batch_size=1, max_in_flight=4, max_policy_lag=0)
    pool.start()
    try:
        pool.next_batch(timeout=10)
        with pytest.raises(RuntimeError, match="max_policy_lag"):
            pool.next_batch(timeout=10)
        pool.update_weights({}, 1)
        assert len(pool.next_batch(timeout=10)) == 1
    finally:
        pool.stop()


def test_admission_and_deadline_arithmetic() -> None:
    # L=0, B=2, outstanding due at 2: capacity up to version 2 is 3 batches = 6 rollouts
    assert admission_feasible([2] * 5, 2, 1, 0, 2)
    assert not admission_feasible([2] * 6, 2, 1, 0, 2)
    assert not admission_feasible([], 0, 1, 1, 2)  # due before the learner version
    # work due later may start while earlier deadlines are full, within the total budget
    assert admission_feasible([1, 1, 1, 1], 3, 1, 0, 2)
    assert not admission_feasible([1, 1, 1, 1, 3, 3, 3, 3], 3, 1, 0, 2)
    assert admission_feasible([1, 1, 1, 1, 3, 3, 3], 3, 1, 0, 2)
    assert required_early([0, 0, 1, 1, 1, 1], 0, 2) == {0: 2, 1: 4}
    assert required_early([3, 3], 0, 2) == {}


@pytest.mark.parametrize(
    ("kw", "key"),
    [
        (dict(samples_per_prompt=0), "samples_per_prompt"),
        (dict(mode="sync", samples_per_prompt=3, batch_size=4), "samples_per_prompt"),
        (dict(mode="later"), "rollout.mode"),
        (dict(batch_size=0), "data.batch_size"),
        (dict(max_policy_lag=-1), "max_policy_lag"),
    ],
)
def test_bad_settings_name_the_field(kw: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        make_pool(Board(), **kw)


def test_update_weights_refuses_an_engine_that_did_not_apply_them() -> None:
    class StuckEngine(FakeEngine):
        def update_weights(self, state_dict, version: int) -> None:
            pass  # silently keeps the old weights and version

    pool, _ = make_pool(Board(open_by_default=True))
    pool.engine = StuckEngine()
    with pytest.raises(RuntimeError, match="not applied"):
        pool.update_weights({}, 1)
    pool.engine.update_weights = FakeEngine.update_weights.__get__(pool.engine)
    pool.update_weights({}, 2)
    with pytest.raises(ValueError, match="version 1"):
        pool.update_weights({}, 1)
    assert pool.stats()["learner_version"] == 2


class RecordingPool:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def update_weights(self, state_dict, version: int) -> None:
        assert set(state_dict) == {"weight", "bias"}
        self.calls.append(("push", version))

    def set_learner_version(self, version: int) -> None:
        self.calls.append(("version", version))


def test_weight_sync_callback_pushes_every_sync_every_optimizer_steps() -> None:
    from types import SimpleNamespace

    from frlab.rollout.callbacks import WeightSyncCallback

    pool = RecordingPool()
    trainer = SimpleNamespace(datamodule=SimpleNamespace(pool=pool))
    module = SimpleNamespace(policy=torch.nn.Linear(2, 2), policy_version=0)
    callback = WeightSyncCallback(sync_every=2)
    callback.on_train_start(trainer, module)
    for version in (1, 1, 2, 3, 4):  # the repeated 1: a batch without an optimizer step
        module.policy_version = version
        callback.on_train_batch_end(trainer, module, None, None, 0)
    assert pool.calls == [("push", 0), ("version", 1), ("push", 2), ("version", 3), ("push", 4)]
    with pytest.raises(ValueError, match="sync_every"):
        WeightSyncCallback(sync_every=0)
    with pytest.raises(RuntimeError, match="no rollout pool"):
        WeightSyncCallback().on_train_start(SimpleNamespace(datamodule=None), module)
    with pytest.raises(AttributeError, match="policy_version"):
        WeightSyncCallback(pool=pool).on_train_start(trainer, SimpleNamespace(policy=module.policy))
