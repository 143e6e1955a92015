"""`toy_single`: one turn, say whether the last digit shown is odd (1) or even (0).

The prompt shows `num_digits` random digits (10**num_digits distinct prompts); the reward is 1
when the first digit of the reply is `last % 2`, else 0. A random-init policy over a ~60-token
vocabulary rarely starts its reply with 0 or 1 (success ~0.05), yet the task is learnable by
a tiny policy in well under 100 updates on CPU: the answer is one token, and a binary answer
gives REINFORCE enough positive samples (a 10-way digit answer learns several times slower).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from envs.base import Env, StepResult
from envs.toy.grading import digits_field, first_digit


class ParityEnv(Env):
    """Single turn: "odd? 3 8 1" -> "1"."""

    def __init__(self, num_digits: int = 2) -> None:
        if int(num_digits) < 1:
            raise ValueError(f"env.num_digits must be >= 1, got {num_digits}")
        self.num_digits = int(num_digits)
        self._answer: int | None = None

    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        return {"digits": [rng.randrange(10) for _ in range(self.num_digits)]}

    @staticmethod
    def answer(task: Mapping[str, Any]) -> int:
        """1 when the last digit of the task is odd, else 0."""
        return digits_field(task, "digits")[-1] % 2

    def reset(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        digits = digits_field(task, "digits")
        self._answer = self.answer(task)
        return [{"role": "user", "content": "odd? " + " ".join(map(str, digits))}]

    def step(self, action_text: str) -> StepResult:
        if self._answer is None:
            raise RuntimeError("ParityEnv.step called before reset (or after the episode ended)")
        given = first_digit(action_text)
        info = {"answer": self._answer, "given": given}
        reward = float(given == self._answer)
        self._answer = None
        return StepResult(observation=None, reward=reward, done=True, info=info)
