"""An engine fault never costs a prompt: a rollout the engine failed sends its prompt (its whole
group) back into the data order, to run again from its start; while the engine reports an
outage the pool admits nothing; the requeued prompts travel with the checkpoint; a prompt the
engine fails more than `max_prompt_retries` times is dropped as `engine_retries_exhausted`; a
fault of the prompt itself is not requeued.

`SwitchEngine` is the test's engine: its requests can be held, it can be switched down (an
outage: every request fails with EngineFault) and up, and it can fail chosen prompts."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import threading
import time

import pytest
import torch
from helpers.pool import pool_settings
from helpers.pool_fakes import TOKENIZER, Board, FakeEngine, GatedEnv, wait_for

from frlab.defaults import agent_loop_config, sampling_params
from frlab.rollout.engine import EngineFault, Outage
from frlab.rollout.pool import RolloutPool


class SwitchEngine(FakeEngine):
    """FakeEngine that can hold its requests (`hold`), go down (`down`: an outage, every
    request fails with EngineFault) and fail the requests of chosen tasks (`faulty`: task n ->
    how many more of its requests fail)."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = threading.Event()
        self.down_since: float | None = None
        self.faulty: dict[int, int] = {}
        self.held = 0
        self.by_task: dict[int, int] = {}

    def go_down(self) -> None:
        self.down_since = time.monotonic()

    def go_up(self) -> None:
        self.down_since = None

    def outage(self) -> Outage | None:
        since = self.down_since
        return None if since is None else Outage(since, "every fake server is down", 300.0)

    async def generate(self, prompt_token_ids, params):  # noqa: ANN001, ANN201
        self.held += 1
        try:
            while self.hold.is_set():
                await asyncio.sleep(0.005)
        finally:
            self.held -= 1
        text = TOKENIZER.decode(prompt_token_ids)  # "<|user|>task 12<|end|>..."
        task = int(re.search(r"task (\d+)", text).group(1))
        self.by_task[task] = self.by_task.get(task, 0) + 1
        if self.down_since is not None:
            raise EngineFault("connection refused by every server")
        if self.faulty.get(task, 0) > 0:
            self.faulty[task] -= 1
            raise EngineFault(f"server died under task {task}")
        return await super().generate(prompt_token_ids, params)


def pool_of(engine: SwitchEngine, board: Board, **kw) -> RolloutPool:  # noqa: ANN003
    cfg = agent_loop_config(max_turns=1, max_len=64, sampling=sampling_params(max_new_tokens=4))
    opts = dict(batch_size=4, max_in_flight=4, max_policy_lag=8, num_env_workers=8) | kw
    tasks = GatedEnv.task_sampler(board=board)
    return RolloutPool(
        engine, lambda: GatedEnv(board), TOKENIZER, cfg, task_sampler=tasks, **pool_settings(**opts)
    )


def ids(batch) -> list[int]:  # noqa: ANN001
    return sorted(t.info["env"]["n"] for t in batch)


def down_with_four_in_flight(engine: SwitchEngine, pool: RolloutPool) -> None:
    """Start the pool with its four requests held, then take the engine down under them."""
    engine.hold.set()
    pool.start()
    wait_for(lambda: engine.held == 4)
    engine.go_down()
    engine.hold.clear()
    wait_for(lambda: pool.stats()["requeued"] == 4)


def test_an_outage_requeues_the_prompts_in_flight_and_admits_nothing_until_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine, board = SwitchEngine(), Board(open_by_default=True)
    pool = pool_of(engine, board)
    try:
        with caplog.at_level(logging.INFO):
            down_with_four_in_flight(engine, pool)
            calls = engine.calls
            time.sleep(1.0)  # two outage polls: no rollout may start meanwhile
            stats = pool.stats()
            assert engine.calls == calls and stats["started"] == 4 and stats["in_flight"] == 0
            assert stats["fleet_down"] and pool.outage_s() is not None
            assert stats["failed"] == 0 and stats["requeued_by_reason"] == {"engine": 4}
            engine.go_up()
            batch = pool.next_batch(timeout=30)
            stats = pool.stats()
    finally:
        pool.stop()
    assert ids(batch) == [0, 1, 2, 3]  # the same prompts, none replaced by a later one
    assert stats["failed"] == 0 and not stats["fleet_down"] and pool.outage_s() is None
    assert stats["outages"]["count"] == 1 and stats["outages"]["total_s"] >= 1.0
    assert stats["fleet_down_s"] == stats["outages"]["total_s"]
    told = [r for r in caplog.records if "rollout fleet" in r.getMessage()]
    assert [r.levelno for r in told] == [logging.WARNING, logging.INFO]  # down once, back once
    assert "4 prompts requeued" in told[-1].getMessage()
    assert not [r for r in caplog.records if "rollout of prompt" in r.getMessage()]


def test_requeued_prompts_run_before_every_later_prompt_in_the_data_order() -> None:
    engine, board = SwitchEngine(), Board(open_by_default=True)
    engine.faulty = {1: 1}  # prompt 1's first request: a server died under it
    pool = pool_of(engine, board, batch_size=2, max_in_flight=1, mode="sync")
    pool.start()
    try:
        batches = [ids(pool.next_batch(timeout=30)) for _ in range(3)]
        stats = pool.stats()
    finally:
        pool.stop()
    assert batches == [[0, 1], [2, 3], [4, 5]]
    assert engine.by_task[1] == 2 and stats["requeued"] == 1 and stats["failed"] == 0


def test_a_group_is_requeued_whole_when_one_sample_meets_an_engine_fault() -> None:
    engine, board = SwitchEngine(), Board(open_by_default=True)
    engine.faulty = {0: 1}  # one of prompt 0's two samples fails
    pool = pool_of(engine, board, mode="sync", samples_per_prompt=2, max_in_flight=4)
    pool.start()
    try:
        batch = pool.next_batch(timeout=30)
        stats = pool.stats()
    finally:
        pool.stop()
    assert ids(batch) == [0, 0, 1, 1]
    assert engine.by_task[0] == 4  # two samples, then both again from the start
    assert stats["requeued_by_reason"] == {"engine": 1}
    assert stats["rejected"] == 0 and stats["failed"] == 0  # the finished sibling is not lost


def test_a_prompt_the_engine_keeps_failing_is_dropped_after_its_retries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine, board = SwitchEngine(), Board(open_by_default=True)
    engine.faulty = {0: 100}
    pool = pool_of(engine, board, batch_size=2, max_in_flight=1, mode="sync", max_prompt_retries=2)
    pool.start()
    try:
        with caplog.at_level(logging.WARNING):
            batch = pool.next_batch(timeout=30)
        stats = pool.stats()
    finally:
        pool.stop()
    assert ids(batch) == [1, 2] and engine.by_task[0] == 3  # the first run and 2 retries
    assert stats["failed_by_reason"] == {"engine_retries_exhausted": 1}
    assert stats["requeued"] == 2
    dropped = [r for r in caplog.records if r.getMessage().startswith("prompt 0 dropped")]
    assert len(dropped) == 1 and "rollout.max_prompt_retries=2" in dropped[0].getMessage()


def test_a_fault_of_the_prompt_itself_is_not_requeued() -> None:
    engine, board = SwitchEngine(), Board(open_by_default=True, plan={0: "env_fail"})
    pool = pool_of(engine, board, batch_size=2, max_in_flight=1, mode="sync")
    pool.start()
    try:
        batch = pool.next_batch(timeout=30)
        stats = pool.stats()
    finally:
        pool.stop()
    assert ids(batch) == [1, 2] and engine.by_task[0] == 1
    assert stats["failed_by_reason"] == {"env_step": 1} and stats["requeued"] == 0


def test_the_requeued_prompts_travel_with_the_checkpoint() -> None:
    """A run stopped (SIGTERM, exit 75) during an outage resumes with its requeued prompts."""
    engine, board = SwitchEngine(), Board(open_by_default=True)
    pool = pool_of(engine, board)
    try:
        down_with_four_in_flight(engine, pool)
        state, before = pool.state_dict(), pool.stats()
    finally:
        pool.stop()
    json.dumps(state)  # plain values
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    assert [p["prompt_id"] for p in state["pending"]] == [0, 1, 2, 3]
    assert state["requeues"] == [[0, 1], [1, 1], [2, 1], [3, 1]]
    resumed_engine = SwitchEngine()
    resumed = pool_of(resumed_engine, Board(open_by_default=True))
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    resumed.start()
    try:
        batch = resumed.next_batch(timeout=30)
        after = resumed.stats()
    finally:
        resumed.stop()
    assert ids(batch) == [0, 1, 2, 3]
    assert before["requeued_by_reason"] == after["requeued_by_reason"] == {"engine": 4}
    assert after["outages"]["count"] == 1 and after["outages"]["total_s"] > 0
