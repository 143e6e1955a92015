"""Preflight for the `objective` node: one component name per slot, each component's
hyperparameters under its own name (so switching a component never carries another's
settings). The objective checks its own node (`Objective.from_config`: unknown keys, unknown
names, undeclared or out-of-range hyperparameters, chosen components or not, and the rules
between a component's hyperparameters); here its errors become `ConfigError`s naming the key,
with close matches, and a slot left empty is refused instead of taking its default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from frlab.config.errors import ConfigError, unknown


def check_objective(node: Mapping[str, Any]) -> Any:
    """Validate the resolved `objective` node and return the composed `Objective`."""
    from frlab.objective import KINDS, HyperparameterError, Objective
    from frlab.registry import RegistryError

    for slot, registry in KINDS.items():
        if node.get(slot) is None:
            raise ConfigError(f"objective.{slot}", f"missing: name a {registry.kind}")
    try:
        return Objective.from_config(node)
    except RegistryError as exc:
        if exc.key is None:
            raise ConfigError("objective", f"cannot compose the objective: {exc}") from exc
        raise unknown(exc.key, exc.kind, exc.name, exc.choices) from exc
    except HyperparameterError as exc:
        key = exc.key if exc.key.startswith("objective.") else f"objective.{exc.key}"
        raise ConfigError(key, exc.reason, value=exc.name, choices=exc.choices or None) from exc
    except (ValueError, TypeError) as exc:
        raise ConfigError("objective", f"cannot compose the objective: {exc}") from exc
