"""The Env interface: abstract methods are enforced, failure defaults to reward <= 0."""

from __future__ import annotations

import random

import pytest

from envs.base import Env, StepResult


class Echo(Env):
    def reset(self, task):
        return [{"role": "user", "content": task["q"]}]

    def step(self, action_text: str) -> StepResult:
        return StepResult(observation=None, reward=float(action_text == "ok"), done=True)

    def sample_task(self, rng: random.Random) -> dict:
        return {"q": str(rng.randrange(3))}


def test_env_is_abstract() -> None:
    with pytest.raises(TypeError):
        Env()  # type: ignore[abstract]


def test_default_failure_label_and_close() -> None:
    env = Echo()
    assert env.failure(0.0) and env.failure(-1.0) and not env.failure(0.5)
    env.close()
    assert env.step("ok") == StepResult(None, 1.0, True, {})
