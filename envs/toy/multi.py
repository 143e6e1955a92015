"""`toy_multi`: two turns; the answer depends on a key revealed only by the first observation.

Turn 1: the prompt asks for the key (with `num_decoys` random decoy digits, none by default:
they slow a tiny policy down); whatever the policy says, the environment replies "key k". Turn 2:
the reward is 1 when the reply starts with a digit of the
parity of k, else 0. The answer is not in the prompt (decoys are independent of k), so a
policy can only beat chance by reading observation tokens, which the agent loop masks out of
the loss: this exercises masking and multi-turn credit assignment. A random-init policy
succeeds ~5-10% of the time.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from envs.base import Env, StepResult, TaskSampler, init_arguments
from envs.toy.grading import digit_field, digits_field, first_digit, same_parity
from frlab.errors import ConfigError


def check_num_decoys(num_decoys: int) -> int:
    """`num_decoys` as an int >= 0, or a ValueError naming `env.num_decoys`."""
    if int(num_decoys) < 0:
        raise ConfigError("env.num_decoys", f"must be >= 0, got {num_decoys}")
    return int(num_decoys)


class KeyParityTasks(TaskSampler):
    """A random key digit and `num_decoys` random decoys per task: {"key": 7, "decoys": [4]}."""

    def __init__(self, num_decoys: int = 0) -> None:
        self.num_decoys = check_num_decoys(num_decoys)

    def sample(self, rng: random.Random) -> dict[str, Any]:
        return {
            "key": rng.randrange(10),
            "decoys": [rng.randrange(10) for _ in range(self.num_decoys)],
        }


class KeyParityEnv(Env):
    """Two turns: "key? 4 9" -> (anything) -> "key 7" -> any odd digit, e.g. "3"."""

    def __init__(self, num_decoys: int = 0) -> None:
        self.num_decoys = check_num_decoys(num_decoys)
        self._key: int | None = None
        self._turn = 0

    @classmethod
    def task_sampler(cls, **kwargs: Any) -> KeyParityTasks:
        """Key tasks with the constructor's `num_decoys`."""
        return KeyParityTasks(init_arguments(cls, kwargs)["num_decoys"])

    def reset(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        self._key = digit_field(task, "key")
        decoys = digits_field(task, "decoys") if task.get("decoys") else []
        self._turn = 0
        return [{"role": "user", "content": " ".join(["key?", *map(str, decoys)])}]

    def step(self, action_text: str) -> StepResult:
        if self._key is None:
            raise RuntimeError("KeyParityEnv.step called before reset (or after the episode ended)")
        self._turn += 1
        if self._turn == 1:
            return StepResult(observation=f"key {self._key}", reward=0.0, done=False)
        info = {"key": self._key, "given": first_digit(action_text)}
        reward = float(same_parity(action_text, self._key))
        self._key = None
        return StepResult(observation=None, reward=reward, done=True, info=info)
