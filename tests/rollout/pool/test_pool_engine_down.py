"""An engine that goes down for good (`Engine.down_reason()`): the pool stops admitting rollouts,
`next_batch` raises `EngineDown` once no batch is ready (batches already finished are still
handed out), and a weight update that fails on the dead engine raises `EngineDown` too."""

from __future__ import annotations

import time

import pytest
from helpers.pool import pool_settings
from test_pool_groups import TOKENIZER, InstantEngine
from test_pool_tasks import DATA, Question

from envs.math import MathEnv
from frlab.defaults import agent_loop_config, sampling_params
from frlab.rollout.engine import EngineDown
from frlab.rollout.pool import RolloutPool


class DyingEngine(InstantEngine):
    """Serves until `die()`; then every request and update fails and it reports down."""

    def __init__(self) -> None:
        super().__init__()
        self.dead = False
        self.requests = 0

    def die(self) -> None:
        self.dead = True

    def down_reason(self) -> str | None:
        return "its process exited (exit code -9)" if self.dead else None

    async def generate(self, prompt_token_ids, params):  # noqa: ANN001, ANN201
        self.requests += 1
        if self.dead:
            raise RuntimeError("engine process is gone")
        return await super().generate(prompt_token_ids, params)

    def update_weights(self, state_dict, version: int) -> None:  # noqa: ANN001
        if self.dead:
            raise RuntimeError("engine process is gone")
        super().update_weights(state_dict, version)


def pool_with(engine: DyingEngine, **kw) -> RolloutPool:  # noqa: ANN003
    cfg = agent_loop_config(max_turns=1, max_len=32, sampling=sampling_params(max_new_tokens=2))
    opts = dict(batch_size=2, max_in_flight=2, max_policy_lag=8, mode="sync", seed=11)
    return RolloutPool(
        engine,
        Question,
        TOKENIZER,
        cfg,
        task_sampler=MathEnv.task_sampler(dataset=DATA),
        **pool_settings(**(opts | kw)),
    )


def test_next_batch_raises_engine_down_and_admits_nothing_more() -> None:
    engine = DyingEngine()
    pool = pool_with(engine, mode="async", max_in_flight=2, batch_size=2)
    pool.start()
    try:
        assert len(pool.next_batch(timeout=30)) == 2
        engine.die()
        time.sleep(0.3)  # rollouts started before the death fail, and none replace them
        with pytest.raises(EngineDown, match="the rollout engine is down: its process exited"):
            for _ in range(5):  # a batch that had finished before the death may still come
                pool.next_batch(timeout=30)
        settled = engine.requests
        time.sleep(0.3)
        assert engine.requests == settled  # no rollout is admitted while it is down
    finally:
        pool.stop()


def test_a_weight_update_on_a_dead_engine_raises_engine_down() -> None:
    engine = DyingEngine()
    pool = pool_with(engine)
    pool.start()
    try:
        pool.next_batch(timeout=30)
        pool.update_weights({}, 1)
        engine.die()
        with pytest.raises(EngineDown, match="exit code -9") as info:
            pool.update_weights({}, 2)
        assert isinstance(info.value.__cause__, RuntimeError)
    finally:
        pool.stop()


def test_an_update_that_fails_on_a_live_engine_is_not_engine_down() -> None:
    class Refusing(DyingEngine):
        def update_weights(self, state_dict, version: int) -> None:  # noqa: ANN001
            raise ValueError("bad state dict")

    pool = pool_with(Refusing())
    pool.start()
    try:
        with pytest.raises(ValueError, match="bad state dict"):
            pool.update_weights({}, 1)
    finally:
        pool.stop()
