"""`toy_faulty`: the parity task with injected faults, to see how a run survives broken envs.

`FaultyParityEnv` is `ParityEnv` whose `step` misbehaves on a fixed share of tasks: the task's
digits read as a number `n` (0 .. 10**num_digits - 1) decide, so which tasks fail follows from
the seed, not from timing. A step on a task with `n % hang_every == 0` blocks for `hang_s`
seconds (never returning within any sensible deadline), `n % raise_every == 1` raises
RuntimeError, and `n % bad_reward_every == 2` returns the reward as a string. 0 turns a fault
off. The rollout pool fails such rollouts and counts them by reason (`env_step_timeout`,
`env_step`, `bad_reward` in summary.json's `rollout_stats.failed_by_reason`); the reliability
tests (tests/reliability) train with it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from envs.base import StepResult
from envs.toy.single import ParityEnv
from frlab.errors import ConfigError


class FaultyParityEnv(ParityEnv):
    """ParityEnv whose steps hang, raise or return a string reward on a fixed share of tasks."""

    def __init__(
        self,
        num_digits: int = 3,
        hang_every: int = 0,
        raise_every: int = 0,
        bad_reward_every: int = 0,
        hang_s: float = 3600.0,
    ) -> None:
        super().__init__(num_digits)
        for name, value in (
            ("hang_every", hang_every),
            ("raise_every", raise_every),
            ("bad_reward_every", bad_reward_every),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"env.{name}", f"must be an integer >= 0, got {value!r}")
        self.hang_every, self.raise_every = hang_every, raise_every
        self.bad_reward_every, self.hang_s = bad_reward_every, float(hang_s)
        self._n = 0

    def reset(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        messages = super().reset(task)
        self._n = int("".join(str(d) for d in task["digits"]))
        return messages

    def fault(self) -> str | None:
        """The fault planned for the current task: "hang", "raise", "bad_reward" or None."""
        for kind, every, rest in (
            ("hang", self.hang_every, 0),
            ("raise", self.raise_every, 1),
            ("bad_reward", self.bad_reward_every, 2),
        ):
            if every and self._n % every == rest % every:
                return kind
        return None

    def step(self, action_text: str) -> StepResult:
        fault = self.fault()
        if fault == "hang":
            threading.Event().wait(self.hang_s)
        if fault == "raise":
            raise RuntimeError(f"injected failure on task {self._n}")
        result = super().step(action_text)
        if fault == "bad_reward":
            result.reward = str(result.reward)  # type: ignore[assignment]
        return result
