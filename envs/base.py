"""The environment interface: episodes (`Env`, one instance each) and tasks (`TaskSampler`).

An environment opens an episode from a task (`reset` -> the initial chat messages) and takes
the policy's action text each turn (`step` -> observation, reward, done, info). Instances hold
per-episode state: the rollout pool builds a fresh one per rollout. `step` may be slow (tools,
games): the agent loop runs it off the event loop. Rewards are summed over the episode;
`failure` labels failed trajectories for the entropy filter (explicit labels, never the
advantage sign). `missing_sources` lets frlab check, before training starts, that the files
and datasets an environment's config names exist.

Tasks come from a separate object: `Env.task_sampler(**kwargs)` builds, from the env node's
keyword arguments and without opening an episode, the `TaskSampler` whose `sample(rng)` draws
each new prompt's task with the rollout pool's RNG (one sampler per pool, so per rank). A
sampler with state beyond that RNG (a shuffled pass over a dataset) returns it from
`state_dict` so a resumed run draws what the uninterrupted run would have. An environment
that only defines `sample_task` on an instance gets the default `task_sampler`: one instance
built with the same arguments, whose `sample_task` draws every task (`EnvTaskSampler`).

`system_prompt` is the conversation's system turn, applied by the agent loop when it renders
the chat template (frlab.rollout.chat): `default` leaves the messages and the template's own
default system prompt alone (SmolLM2 and Qwen templates inject one when the conversation has
no system turn), `none` renders no system turn at all, any other text becomes the system turn.
"""

from __future__ import annotations

import abc
import inspect
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from frlab.errors import ConfigError


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
        raise ConfigError(
            key,
            "must be 'default' (the chat template's), 'none' (no system turn) or the system "
            f"prompt text, got {value!r}",
        )
    return value


class TaskSampler(abc.ABC):
    """Draws the tasks of a run, one per new prompt, with the rollout pool's RNG."""

    @abc.abstractmethod
    def sample(self, rng: random.Random) -> dict[str, Any]:
        """Draw one task (a plain dict; the pool assigns prompt ids)."""

    def state_dict(self) -> dict[str, Any]:
        """State beyond the pool's RNG that the next draws depend on (plain Python values, saved
        in the pool's checkpoint); {} by default: draws depend on the RNG only."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: B027 - optional hook
        """Restore `state_dict()`'s output ({} when the checkpoint holds none: start afresh)."""

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release resources; the rollout pool calls it when it stops."""


class EnvTaskSampler(TaskSampler):
    """Tasks from one environment instance's `sample_task` (the default `Env.task_sampler`,
    for environments that define no sampler of their own); closes that instance."""

    def __init__(self, env: Any) -> None:
        if getattr(type(env), "sample_task", Env.sample_task) is Env.sample_task:
            raise TypeError(
                f"{type(env).__name__} can neither build a task sampler nor sample tasks: "
                "define the classmethod `task_sampler` or the method `sample_task`"
            )
        self.env = env

    def sample(self, rng: random.Random) -> dict[str, Any]:
        return self.env.sample_task(rng)

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


def init_arguments(cls: type, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """`kwargs` bound to `cls`'s constructor with its defaults filled in (TypeError for an
    unknown or missing argument): a `task_sampler` reads the values the env would get."""
    bound = inspect.signature(cls).bind(**kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


class Env(abc.ABC):
    """A text environment for an LLM agent: one instance plays one episode."""

    system_prompt: str = "default"  # default | none | the text (module docstring)

    @abc.abstractmethod
    def reset(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        """Start an episode for `task`; return the initial chat messages ({role, content})."""

    @abc.abstractmethod
    def step(self, action_text: str) -> StepResult:
        """Apply the policy's action text (one assistant turn) and return the outcome."""

    @classmethod
    def task_sampler(cls, **kwargs: Any) -> TaskSampler:
        """The tasks of a run for the env node's keyword arguments `kwargs`. Override it to
        draw tasks without building an episode environment (every frlab env does); the
        default builds one instance, `cls(**kwargs)`, and draws with its `sample_task`."""
        return EnvTaskSampler(cls(**kwargs))

    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        """Draw one task from this instance: the hook the default `task_sampler` uses, for an
        environment that defines no sampler of its own."""
        raise NotImplementedError(
            f"{type(self).__name__} defines neither the classmethod `task_sampler` nor "
            "`sample_task`: one of them draws the tasks"
        )

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
