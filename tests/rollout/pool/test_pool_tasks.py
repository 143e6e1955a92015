"""The pool draws tasks from its task sampler (envs.base.TaskSampler): it builds one environment
per rollout and none for sampling, closes the sampler when it stops, and a resumed pool draws
the tasks the uninterrupted pool draws (the sampler's state travels with the checkpoint)."""

from __future__ import annotations

import io
import random
import threading
from typing import Any

import pytest
import torch
from helpers.pool import pool_settings
from test_pool_groups import TOKENIZER, InstantEngine  # the groups tests' instant engine

from envs.base import Env, StepResult, TaskSampler
from envs.math import MathEnv
from frlab.defaults import agent_loop_config, sampling_params
from frlab.rollout.pool import RolloutPool

DATA = [{"question": f"q{i}", "answer": str(i)} for i in range(5)]


class Question(Env):
    """One turn: shows the task's question; the step reports it back. Counts its instances."""

    built = 0
    lock = threading.Lock()

    def __init__(self) -> None:
        with Question.lock:
            Question.built += 1
        self.question = ""

    @classmethod
    def task_sampler(cls, **kwargs: Any) -> TaskSampler:
        return CountingTasks()

    def reset(self, task):
        self.question = task["question"]
        return [{"role": "user", "content": "q"}]

    def step(self, action_text: str) -> StepResult:
        return StepResult(None, 1.0, True, {"question": self.question})


class CountingTasks(TaskSampler):
    def __init__(self) -> None:
        self.drawn, self.closed = 0, False

    def sample(self, rng: random.Random) -> dict[str, Any]:
        self.drawn += 1
        return dict(rng.choice(DATA))

    def close(self) -> None:
        self.closed = True


def make_pool(task_sampler: TaskSampler, **kw: Any) -> RolloutPool:
    cfg = agent_loop_config(max_turns=1, max_len=32, sampling=sampling_params(max_new_tokens=2))
    opts = dict(batch_size=2, max_in_flight=2, max_policy_lag=8, mode="sync", seed=11)
    return RolloutPool(
        InstantEngine(),
        Question,
        TOKENIZER,
        cfg,
        task_sampler=task_sampler,
        **pool_settings(**(opts | kw)),
    )


def questions(pool: RolloutPool, batches: int) -> dict[int, str]:
    """{prompt id: question} of the next `batches` batches."""
    got = {}
    for _ in range(batches):
        for traj in pool.next_batch(timeout=30):
            got[traj.prompt_id] = traj.info["env"]["question"]
    return got


def test_the_pool_builds_one_env_per_rollout_and_none_to_draw_tasks() -> None:
    Question.built = 0
    tasks = Question.task_sampler()
    pool = make_pool(tasks)
    pool.start()
    try:
        questions(pool, 3)
        stats = pool.stats()
    finally:
        pool.stop()
    assert stats["started"] == stats["consumed"] == 6
    assert Question.built == 6 and tasks.drawn == stats["prompts"] == 6
    assert tasks.closed


def test_a_resumed_pool_draws_the_tasks_of_the_uninterrupted_run() -> None:
    straight = make_pool(MathEnv.task_sampler(dataset=DATA))
    straight.start()
    try:
        head = questions(straight, 3)  # 6 draws: one pass of 5 and one task of the next
        buf = io.BytesIO()
        torch.save(straight.state_dict(), buf)
        tail = questions(straight, 4)
    finally:
        straight.stop()
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert len(state["task_sampler"]["order"]) == 4 and not state["pending"]
    resumed = make_pool(MathEnv.task_sampler(dataset=DATA), seed=99)  # the state sets the RNG
    resumed.load_state_dict(state)
    resumed.start()
    try:
        assert questions(resumed, 4) == tail
    finally:
        resumed.stop()
    assert sorted(list(head.values())[:5]) == [t["question"] for t in DATA]


def test_a_pool_needs_a_task_sampler() -> None:
    with pytest.raises(TypeError, match="task_sampler must be a TaskSampler"):
        make_pool(Question)  # type: ignore[arg-type]
