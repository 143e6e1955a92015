"""`ProcessTorchEngine` (rollout/engine=torch_process): the torch engine's sampler in a child
process over shared-memory weights. It must answer exactly as the in-process `TorchEngine`
(same tokens, log-probs, versions, MoE routing), see weight updates made in place, and fail
cleanly: a dead child fails every pending request, shutdown reaps it, every wait has a deadline."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
import torch
from helpers.torch_engine import VOCAB, tiny_model

from frlab.defaults import process_engine, sampling_params, torch_engine
from frlab.rollout.engine import EngineError, SamplingParams

pytestmark = pytest.mark.slow  # a module fixture starts servers or runs a training run

THREADS = torch.get_num_threads()  # the child uses the same count: identical float results


def requests(n: int, new_tokens: int = 8) -> list[tuple[list[int], SamplingParams]]:
    """Prompts of different lengths; odd ones seeded, even ones from the engine's own stream."""
    return [
        (
            [1 + i % 7] * (2 + i % 5),
            sampling_params(
                max_new_tokens=new_tokens + i % 3,
                stop_token_ids=(5,),
                seed=1000 + i if i % 2 else None,
            ),
        )
        for i in range(n)
    ]


def serve(engine, reqs) -> list:  # noqa: ANN001
    async def run() -> list:
        return await asyncio.gather(*engine.generate_many(reqs))

    return asyncio.run(run())


def results(engine, model, reqs, shifted) -> list:  # noqa: ANN001
    """Serve `reqs`, push `shifted` weights as version 7, serve them again."""
    with engine:
        first = serve(engine, reqs)
        engine.update_weights(shifted, 7)
        assert engine.version == 7
        return first + serve(engine, reqs)


def fields(r) -> tuple:  # noqa: ANN001
    return (r.token_ids, r.log_probs, r.versions, r.finish_reason)


@pytest.fixture(scope="module")
def running():  # noqa: ANN201
    """One started engine (and its model) shared by the tests that leave it serving: each
    spawn costs seconds of imports in the child."""
    model = tiny_model(1, sharpness=1.0)
    with process_engine(model, num_threads=1) as engine:
        yield engine, model


def test_the_child_answers_exactly_as_the_in_process_engine_before_and_after_an_update() -> None:
    model = tiny_model(0, sharpness=4.0)
    reqs = requests(12)
    shifted = {k: v + 0.02 * torch.randn_like(v) for k, v in model.state_dict().items()}
    thread = results(torch_engine(model, max_batch_size=16, seed=3), model, reqs, shifted)
    process = results(
        process_engine(model, max_batch_size=16, seed=3, num_threads=THREADS),
        model,
        reqs,
        shifted,
    )
    assert [fields(r) for r in process] == [fields(r) for r in thread]
    assert {v for r in process[:12] for v in r.versions} == {0}
    assert {v for r in process[12:] for v in r.versions} == {7}
    assert [r.token_ids for r in process[:12]] != [r.token_ids for r in process[12:]]
    assert any(r.finish_reason == "stop" for r in process)  # stop ids travel too


def test_moe_routing_travels_back_and_equals_the_in_process_record() -> None:
    from tests.model.test_routing_replay_pipeline import VOCAB as MOE_VOCAB
    from tests.model.test_routing_replay_pipeline import tiny_moe

    model = tiny_moe(0)
    reqs = [([3, 4, 5 + i], sampling_params(max_new_tokens=4, seed=i)) for i in range(3)]
    assert max(t for p, _ in reqs for t in p) < MOE_VOCAB
    engines = (
        torch_engine(model, record_routing=True),
        process_engine(model, record_routing=True, num_threads=THREADS),
    )
    outs = []
    for engine in engines:
        with engine:
            outs.append(serve(engine, reqs))
    for a, b in zip(*outs, strict=True):
        assert fields(a) == fields(b)
        assert b.routing is not None and b.routing.dtype == a.routing.dtype
        assert torch.equal(a.routing, b.routing)
        assert b.routing.shape[0] == len(b.token_ids) + 3 - 1


def test_an_update_lands_between_decode_steps_and_later_tokens_carry_it(running) -> None:
    engine, model = running
    old = engine.version
    new = old + 1

    async def run() -> list:
        long = engine.generate_many([([1, 2], sampling_params(max_new_tokens=120))])[0]
        await asyncio.sleep(0.05)
        engine.update_weights(model.state_dict(), new)
        after = engine.generate_many([([1, 2], sampling_params(max_new_tokens=4))])[0]
        return [await long, await after]

    long, after = asyncio.run(run())
    assert long.versions == sorted(long.versions) and set(long.versions) <= {old, new}
    assert after.versions == [new] * 4


def test_pause_holds_decoding_until_resume(running) -> None:
    engine, _ = running

    async def run() -> tuple[bool, list[int]]:
        engine.pause()
        (future,) = engine.generate_many([([1, 2, 3], sampling_params(max_new_tokens=3))])
        await asyncio.sleep(0.5)
        held = not future.done()
        engine.resume()
        return held, (await asyncio.wait_for(future, 30)).token_ids

    held, tokens = asyncio.run(run())
    assert held and len(tokens) == 3


def test_a_dead_child_fails_pending_requests_and_refuses_new_ones() -> None:
    engine = process_engine(tiny_model(3), num_threads=1)
    engine.start()
    try:

        async def run() -> None:
            engine.pause()  # the request stays pending in the child
            (future,) = engine.generate_many([([1, 2], sampling_params(max_new_tokens=3))])
            await asyncio.sleep(0.2)
            assert engine.down_reason() is None
            os.kill(engine._process.pid, signal.SIGKILL)
            with pytest.raises(EngineError, match="exit code -9"):
                await asyncio.wait_for(future, 30)
            with pytest.raises(EngineError, match="not running.*exit code -9"):
                engine.generate_many([([1], sampling_params())])
            assert "exit code -9" in engine.down_reason()  # the pool stops the run on it

        asyncio.run(run())
    finally:
        engine.shutdown()
    assert not engine._process.is_alive()


def test_shutdown_fails_pending_requests_and_reaps_the_child() -> None:
    engine = process_engine(tiny_model(4), num_threads=1)
    engine.start()

    async def run() -> None:
        engine.pause()
        futures = engine.generate_many(requests(3))
        await asyncio.sleep(0.2)
        started = time.monotonic()
        engine.shutdown()
        for future in futures:
            with pytest.raises(EngineError, match="shut down"):
                await asyncio.wait_for(future, 30)
        assert time.monotonic() - started < 30

    asyncio.run(run())
    assert engine._process.exitcode == 0, "the child stopped on request, not killed"
    assert engine.down_reason() is None  # shut down on purpose: not a failure
    with pytest.raises(EngineError, match="shut down"):
        engine.start()


def test_a_cancelled_request_is_dropped_and_the_engine_keeps_serving(running) -> None:
    engine, _ = running

    async def run() -> list[int]:
        (slow,) = engine.generate_many([([1, 2], sampling_params(max_new_tokens=100))])
        slow.cancel()
        (fast,) = engine.generate_many([([3, 4], sampling_params(max_new_tokens=2))])
        return (await asyncio.wait_for(fast, 30)).token_ids

    assert len(asyncio.run(run())) == 2
    assert engine._futures == {}


def test_start_has_a_deadline_and_leaves_no_child_behind() -> None:
    engine = process_engine(tiny_model(6), num_threads=1, start_timeout_s=0.01)
    with pytest.raises(EngineError, match="did not start within .*start_timeout_s"):
        engine.start()
    assert not engine._process.is_alive()
    with pytest.raises(EngineError, match="process failed.*did not start"):
        engine.start()  # not silently "started" over a dead process
    with pytest.raises(EngineError, match="not running"):
        engine.generate_many([([1], sampling_params())])


def test_too_little_shared_memory_is_refused_before_copying_the_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import shutil

    model = tiny_model(0)
    need = sum(p.numel() * p.element_size() for p in model.parameters())
    free = type("Usage", (), {"free": need - 1})
    monkeypatch.setattr(shutil, "disk_usage", lambda path: free)
    with pytest.raises(ValueError, match=r"needs \d+ MiB of shared memory.*--shm-size"):
        process_engine(model)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"device": "cuda"}, "rollout.engine.device='cuda'.*CPU only"),
        ({"num_threads": 0}, "rollout.engine.num_threads`: must be >= 1"),
        ({"max_batch_size": 0}, "rollout.engine.max_batch_size`: must be >= 1"),
        ({"start_timeout_s": 0}, "rollout.engine.start_timeout_s`: must be > 0"),
        ({"record_routing": True}, "rollout.engine.record_routing=true needs an MoE model"),
    ],
)
def test_bad_settings_name_their_key(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        process_engine(tiny_model(0), **kwargs)


def test_bad_requests_and_updates_raise_before_reaching_the_child(running) -> None:
    with pytest.raises(EngineError, match="call start"):
        process_engine(tiny_model(7), num_threads=1).generate_many([([1], sampling_params())])
    engine, model = running
    version = engine.version
    with pytest.raises(ValueError, match="outside"):
        engine.generate_many([([1, VOCAB], sampling_params())])
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate_many([([1], sampling_params(max_new_tokens=0))])
    with pytest.raises(KeyError, match="missing"):
        engine.update_weights({}, version + 1)
    with pytest.raises(ValueError, match="version must be >= 0"):
        engine.update_weights(model.state_dict(), -1)
    assert engine.version == version
    assert len(serve(engine, requests(2))) == 2  # still serving


def test_a_reply_for_a_request_its_caller_cancelled_meanwhile_is_dropped_quietly() -> None:
    """The reader thread must survive a caller cancelling between its lookup and set_result
    (it would die with InvalidStateError and every later request would hang)."""
    import concurrent.futures

    engine = process_engine(tiny_model(0), num_threads=1)  # not started: no child needed
    cancelled, malformed, good = (concurrent.futures.Future() for _ in range(3))
    engine._futures.update({1: cancelled, 2: malformed, 3: good})
    cancelled.cancel()
    engine._resolve(("result", 1, [4], [-0.5], [0], "length", None))
    engine._resolve(("result", 2, [4, 5], [-0.5], [0], "length", None))  # lengths differ
    engine._resolve(("result", 3, [4], [-0.5], [0], "stop", None))
    assert cancelled.cancelled() and engine._futures == {}
    with pytest.raises(EngineError, match="bad reply.*lengths differ"):
        malformed.result(0)
    assert good.result(0).token_ids == [4] and good.result(0).finish_reason == "stop"
    late = concurrent.futures.Future()
    engine._futures[4] = late
    late.cancel()
    engine._fail("gone")  # no InvalidStateError either


def test_the_open_files_limit_is_raised_for_the_shared_weights_or_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One open file per shared storage (in both processes): a soft limit below that plus a
    margin is raised up to the hard limit; a hard limit below it is refused with a clear error."""
    import resource

    from frlab.rollout.torch import shared_weights

    model = tiny_model(0)
    tensors = len(list(model.parameters())) + len(list(model.buffers()))
    need = tensors + shared_weights.FD_MARGIN
    limits = {"now": (need - 1, need + 10)}
    monkeypatch.setattr(resource, "getrlimit", lambda kind: limits["now"])
    monkeypatch.setattr(resource, "setrlimit", lambda kind, pair: limits.update(now=pair))
    shared_weights.check_open_files(model)
    assert limits["now"] == (need, need + 10)
    limits["now"] = (need - 1, need - 1)
    with pytest.raises(ValueError, match=rf"shares {tensors} weight tensors.*hard limit is"):
        shared_weights.check_open_files(model)
