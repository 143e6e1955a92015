"""A policy as a Python caller builds one: the `model` keys from their declaration.

`policy_of(config=..., seed=0, **changes)` is `build_policy` with every `model` key at its
declared default (frlab.config.schema.ModelConfig) but those given; `name_or_path` loads a
checkpoint instead of random-initialising `config`.
"""

from __future__ import annotations

from typing import Any

from frlab.config.arguments import declared_arguments
from frlab.config.schema import ModelConfig
from frlab.model.policy import build_policy


def model_arguments(**changes: Any) -> dict[str, Any]:
    """The `model` keys `build_policy` takes, at their declared defaults, with `changes`."""
    return declared_arguments(ModelConfig, **{"name_or_path": None, "config": None, **changes})


def policy_of(name_or_path: str | None = None, *, seed: int | None = 0, **changes: Any) -> Any:
    return build_policy(**model_arguments(name_or_path=name_or_path, **changes), seed=seed)
