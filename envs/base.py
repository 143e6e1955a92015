"""The environment interface the agent loop drives (one instance per episode).

An environment opens an episode from a task (`reset` -> the initial chat messages), takes
the policy's action text each turn (`step` -> observation, reward, done, info) and samples
tasks for the rollout pool (`sample_task`). Instances hold per-episode state: build a fresh
one per rollout. `step` may be slow (tools, games): the agent loop runs it off the event loop.
Rewards are summed over the episode; `failure` labels failed trajectories for the entropy
filter (explicit labels, never the advantage sign). `missing_sources` lets frlab check, before
training starts, that the files and datasets an environment's config names exist.

`system_prompt` is the conversation's system turn, applied by the agent loop when it renders
the chat template (frlab.rollout.chat): `default` leaves the messages and the template's own
default system prompt alone (SmolLM2 and Qwen templates inject one when the conversation has
no system turn), `none` renders no system turn at all, any other text becomes the system turn.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StepResult:
    """One environment step: the next observation (None when the episode ends), its reward."""

    observation: str | None
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


SYSTEM_PROMPT_MODES = ("default", "none")


def check_system_prompt(value: object, key: str = "env.system_prompt") -> str:
    """`value` if it is `default`, `none` or a non-empty text; ValueError naming `key`."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(
            f"{key} must be 'default' (the chat template's), 'none' (no system turn) or the "
            f"system prompt text, got {value!r}"
        )
    return value


class Env(abc.ABC):
    """A text environment for an LLM agent."""

    system_prompt: str = "default"  # default | none | the text (module docstring)

    @abc.abstractmethod
    def reset(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        """Start an episode for `task`; return the initial chat messages ({role, content})."""

    @abc.abstractmethod
    def step(self, action_text: str) -> StepResult:
        """Apply the policy's action text (one assistant turn) and return the outcome."""

    @abc.abstractmethod
    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        """Draw one task (a plain dict; the pool assigns prompt ids)."""

    @classmethod
    def missing_sources(cls, config: Mapping[str, Any]) -> dict[str, str]:
        """{config key: what is missing} for every file, folder or dataset named by `config`
        (the env node's keyword arguments) that is not available locally; {} when all are.
        Cheap: looks at the file system and caches, never loads or downloads. Default: none."""
        return {}

    def failure(self, reward: float) -> bool:
        """Whether an episode with total `reward` counts as failed (default: reward <= 0)."""
        return float(reward) <= 0.0

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release resources (subprocesses, files); the default holds none."""
