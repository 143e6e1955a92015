"""`toy_single`: one turn, reply with a digit of the same parity as the last digit shown.

The prompt shows `num_digits` random digits (10**num_digits distinct prompts); the reward is 1
when the reply starts with a digit of the parity of the last one shown, else 0. Random-init
policies over a ~60-token vocabulary rarely start with a digit (success ~0.05-0.1); the answer
is one token, so a tiny policy learns it in well under 100 updates on CPU. Five correct
tokens per prompt (any odd or any even digit) avoid early collapse onto a constant reply.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from envs.base import Env, StepResult, TaskSampler, init_arguments
from envs.toy.grading import digits_field, first_digit, same_parity
from frlab.errors import ConfigError


def check_num_digits(num_digits: int) -> int:
    """`num_digits` as an int >= 1, or a ValueError naming `env.num_digits`."""
    if int(num_digits) < 1:
        raise ConfigError("env.num_digits", f"must be >= 1, got {num_digits}")
    return int(num_digits)


class ParityTasks(TaskSampler):
    """`num_digits` random digits per task: {"digits": [3, 8]}."""

    def __init__(self, num_digits: int = 2) -> None:
        self.num_digits = check_num_digits(num_digits)

    def sample(self, rng: random.Random) -> dict[str, Any]:
        return {"digits": [rng.randrange(10) for _ in range(self.num_digits)]}


class ParityEnv(Env):
    """Single turn: "parity: 3 8" -> any even digit, e.g. "4"."""

    def __init__(self, num_digits: int = 2) -> None:
        self.num_digits = check_num_digits(num_digits)
        self._target: int | None = None

    @classmethod
    def task_sampler(cls, **kwargs: Any) -> ParityTasks:
        """Digit tasks of the constructor's `num_digits` (subclasses keep their own default)."""
        return ParityTasks(init_arguments(cls, kwargs)["num_digits"])

    def reset(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        digits = digits_field(task, "digits")
        self._target = digits[-1]
        return [{"role": "user", "content": "parity: " + " ".join(map(str, digits))}]

    def step(self, action_text: str) -> StepResult:
        if self._target is None:
            raise RuntimeError("ParityEnv.step called before reset (or after the episode ended)")
        info = {"target": self._target, "given": first_digit(action_text)}
        reward = float(same_parity(action_text, self._target))
        self._target = None
        return StepResult(observation=None, reward=reward, done=True, info=info)
