"""LockstepGate: engine calls go out only when every live rollout waits, all together, in key
order, whatever order the calls arrived in; closing a rollout releases the others."""

from __future__ import annotations

import asyncio

import pytest

from frlab.defaults import sampling_params
from frlab.rollout.engine import Engine, GenerationResult
from frlab.rollout.pool.lockstep import LockstepGate


class RecordingEngine(Engine):
    """Answers every request at once with its prompt's first id; records each submission."""

    def __init__(self) -> None:
        self.submissions: list[list[int]] = []

    version = 0

    def start(self) -> None: ...
    def shutdown(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def update_weights(self, state_dict, version) -> None: ...

    async def generate(self, prompt_token_ids, params) -> GenerationResult:
        return GenerationResult([prompt_token_ids[0]], [0.0], [0], "length")

    def generate_many(self, requests):
        if any(p[0] < 0 for p, _ in requests):
            raise ValueError("negative prompt id")
        self.submissions.append([p[0] for p, _ in requests])
        return super().generate_many(requests)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_calls_wait_for_every_live_client_and_go_out_in_key_order() -> None:
    async def run() -> tuple[list[list[int]], list[int]]:
        engine = RecordingEngine()
        gate = LockstepGate(engine, wake=lambda: None)
        clients = {key: gate.client(key) for key in (30, 10, 20)}
        tasks = {
            k: asyncio.ensure_future(c.generate([k], sampling_params())) for k, c in clients.items()
        }
        await settle()
        assert gate.release() == 3
        assert gate.release() == 0  # taken: not sent twice
        results = [(await tasks[k]).token_ids[0] for k in (10, 20, 30)]
        return engine.submissions, results

    submissions, results = asyncio.run(run())
    assert submissions == [[10, 20, 30]] and results == [10, 20, 30]


def test_a_client_busy_elsewhere_holds_the_others_until_it_waits_or_closes() -> None:
    async def run() -> list[list[int]]:
        engine = RecordingEngine()
        gate = LockstepGate(engine, wake=lambda: None)
        a, b, c = gate.client(1), gate.client(2), gate.client(3)
        ta = asyncio.ensure_future(a.generate([1], sampling_params()))
        tb = asyncio.ensure_future(b.generate([2], sampling_params()))
        await settle()
        assert gate.release() == 0  # client 3 is still stepping its environment
        c.close()
        assert gate.release() == 2
        await asyncio.gather(ta, tb)
        tb2 = asyncio.ensure_future(b.generate([2], sampling_params()))
        await settle()
        assert gate.release() == 0  # a is live and not waiting
        a.close()
        assert gate.release() == 1
        await tb2
        return engine.submissions

    assert asyncio.run(run()) == [[1, 2], [2]]


def test_a_bad_request_fails_only_its_own_caller() -> None:
    async def run() -> None:
        gate = LockstepGate(RecordingEngine(), wake=lambda: None)
        good, bad = gate.client(1), gate.client(2)
        tg = asyncio.ensure_future(good.generate([5], sampling_params()))
        tb = asyncio.ensure_future(bad.generate([-1], sampling_params()))
        await settle()
        assert gate.release() == 2
        assert (await tg).token_ids == [5]
        with pytest.raises(ValueError, match="negative"):
            await tb

    asyncio.run(run())


def test_keys_are_unique_and_wake_is_called_on_wait_and_close() -> None:
    wakes: list[int] = []
    gate = LockstepGate(RecordingEngine(), wake=lambda: wakes.append(1))
    client = gate.client("a")
    with pytest.raises(ValueError, match="already live"):
        gate.client("a")
    client.close()
    assert wakes and "a" not in gate.live
