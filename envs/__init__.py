"""Environments for frlab agents: the `Env` interface (envs.base) and implementations.

Importing `envs` is cheap: heavy environments (ALFWorld, sandboxes) live in their own
subpackages and import their dependencies only when used.
"""

from envs.base import Env, StepResult

__all__ = ["Env", "StepResult"]
