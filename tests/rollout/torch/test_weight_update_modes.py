"""`rollout.weight_update` on both torch engines (in-process and the child process), with a
request running when new weights land. Checked against fresh full forwards of each weight set:

- every token tagged with the old version has the old weights' log-prob over its context;
- in_flight: later tokens carry the new version and are NOT the new weights' fresh forward
  (they attend to KV the old weights computed);
- resubmit: later tokens ARE the new weights' fresh forward (a fresh prefill on them);
- drain: the update waits until the running request has finished (all its tokens old), and a
  request submitted meanwhile runs wholly on the new weights.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch
from helpers.torch_engine import recomputed_log_probs, tiny_model

from frlab.defaults import process_engine, sampling_params, torch_engine

PROMPT = [1, 2, 3]
LONG = sampling_params(max_new_tokens=100, seed=7)
ENGINES = {"torch": torch_engine, "torch_process": process_engine}


def running(engine) -> int:  # noqa: ANN001
    """Rows the engine's serving loop reports decoding (in-process or the child's count)."""
    value = engine._running
    return int(getattr(value, "value", value))


def wait_until(predicate, timeout: float = 60.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.0005)


def spans(result) -> tuple[int, int]:  # noqa: ANN001
    """(tokens of the old version, tokens of the new one) of a result with two versions."""
    old = result.versions.count(result.versions[0])
    assert result.versions == sorted(result.versions)
    return old, len(result.versions) - old


def diffs(model, result) -> torch.Tensor:  # noqa: ANN001
    fresh = recomputed_log_probs(model, PROMPT, result.token_ids, 1.0)
    return (fresh - torch.tensor(result.log_probs)).abs()


def build(name: str, mode: str, old) -> object:  # noqa: ANN001
    kw = {"num_threads": 1} if name == "torch_process" else {}
    engine = ENGINES[name](old, max_batch_size=4, weight_update=mode, packed_prefill=False, **kw)
    engine.start()
    return engine


@pytest.fixture(scope="module")
def weights():  # noqa: ANN201
    return tiny_model(0), tiny_model(1)


def run_across_an_update(engine, new) -> object:  # noqa: ANN001
    """A long request that the update meets while it decodes: the engine is paused between
    two of its steps, updated, resumed."""

    async def go():  # noqa: ANN202
        (long,) = engine.generate_many([(PROMPT, LONG)])
        await asyncio.to_thread(wait_until, lambda: running(engine) > 0)
        await asyncio.sleep(0.002)
        engine.pause()
        await asyncio.to_thread(engine.update_weights, new.state_dict(), 1)
        engine.resume()
        return await long

    return asyncio.run(go())


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ENGINES))
def test_in_flight_keeps_the_kv_cache_and_labels_every_token(name: str, weights) -> None:  # noqa: ANN001
    old, new = weights
    engine = build(name, "in_flight", old)
    try:
        result = run_across_an_update(engine, new)
    finally:
        engine.shutdown()
    before, after = spans(result)
    assert before > 0 and after > 0 and set(result.versions) == {0, 1}
    assert diffs(old, result)[:before].max() < 1e-4
    assert diffs(new, result)[before:].max() > 1e-3  # new weights over the old weights' KV


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ENGINES))
def test_resubmit_goes_on_from_a_fresh_prefill_on_the_new_weights(name: str, weights) -> None:  # noqa: ANN001
    old, new = weights
    engine = build(name, "resubmit", old)
    try:
        result = run_across_an_update(engine, new)
    finally:
        engine.shutdown()
    before, after = spans(result)
    assert before > 0 and after > 0 and len(result.token_ids) == LONG.max_new_tokens
    assert diffs(old, result)[:before].max() < 1e-4
    assert diffs(new, result)[before:].max() < 1e-4  # every new token: the new weights' forward


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ENGINES))
def test_drain_waits_for_the_running_request_and_holds_new_ones(name: str, weights) -> None:  # noqa: ANN001
    old, new = weights
    engine = build(name, "drain", old)
    try:

        async def go():  # noqa: ANN202
            (long,) = engine.generate_many([(PROMPT, LONG)])
            await asyncio.to_thread(wait_until, lambda: running(engine) > 0)
            update = threading.Thread(target=engine.update_weights, args=(new.state_dict(), 1))
            update.start()  # the long request is decoding: in_flight would land mid-request
            await asyncio.sleep(0.01)
            (short,) = engine.generate_many([(PROMPT, sampling_params(max_new_tokens=5, seed=3))])
            first = await long
            second = await short
            await asyncio.to_thread(update.join, 60)
            return first, second

        first, second = asyncio.run(go())
    finally:
        engine.shutdown()
    assert set(first.versions) == {0} and diffs(old, first).max() < 1e-4
    assert set(second.versions) == {1} and diffs(new, second).max() < 1e-4


def test_resubmit_is_refused_with_routing_replay() -> None:
    with pytest.raises(ValueError, match="routing_replay"):
        torch_engine(tiny_model(0), weight_update="resubmit", record_routing=True)


def test_an_unknown_mode_names_the_key() -> None:
    with pytest.raises(ValueError, match="rollout.weight_update"):
        torch_engine(tiny_model(0), weight_update="eventually")


def test_a_request_across_several_updates_is_as_old_as_its_oldest_token(weights) -> None:  # noqa: ANN001
    """In flight, one request meets three updates: its tokens carry versions 0..3, and the
    lag the pool records and the learner logs is counted from its OLDEST token (version 0)."""
    from frlab.data.batch import Trajectory, collate
    from frlab.learner import metrics
    from frlab.learner.metrics import StepMetrics
    from frlab.rollout.pool.admission import lag_info

    old, new = weights
    engine = build("torch", "in_flight", old)
    forwards = [0]  # the engine's forward passes: one per decode step
    engine._model.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    try:

        async def go():  # noqa: ANN202
            (long,) = engine.generate_many([(PROMPT, LONG)])
            await asyncio.to_thread(wait_until, lambda: running(engine) > 0)
            for version in (1, 2, 3):
                # at least one step on the weights of the previous version (however loaded
                # the machine), so that every version labels a token
                seen = forwards[0]
                await asyncio.to_thread(wait_until, lambda seen=seen: forwards[0] > seen + 1)
                engine.pause()
                source = new if version % 2 else old
                await asyncio.to_thread(engine.update_weights, source.state_dict(), version)
                engine.resume()
            return await long

        result = asyncio.run(go())
    finally:
        engine.shutdown()
    assert result.versions == sorted(result.versions) and set(result.versions) == {0, 1, 2, 3}
    n = len(result.token_ids)
    traj = Trajectory(
        PROMPT + result.token_ids,
        [False] * len(PROMPT) + [True] * n,
        [0.0] * len(PROMPT) + result.log_probs,
        [-1] * len(PROMPT) + result.versions,
        reward=1.0,
        prompt_id=0,
    )
    info = lag_info(4, 0, traj)
    assert info["policy_lag_max"] == 4 and info["policy_lag_min"] == 1
    step = StepMetrics()
    step.update_batch(collate([traj], 0), policy_version=4)
    values = step.compute()
    assert values[metrics.LAG_MAX] == 4.0 and values[metrics.LAG_MEAN] == 4.0
    expected = sum(4 - v for v in result.versions) / n
    assert values[metrics.LAG_TOKEN_MEAN] == pytest.approx(expected, rel=1e-12)
