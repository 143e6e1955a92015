"""Environments for frlab agents: the `Env` interface (envs.base) and implementations.

Importing `envs` is cheap: heavy environments (ALFWorld, sandboxes) live in their own
subpackages and import their dependencies only when used.
"""

from envs.base import Env, EnvTaskSampler, StepResult, TaskSampler

__all__ = ["Env", "EnvTaskSampler", "StepResult", "TaskSampler"]
