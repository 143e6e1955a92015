"""Preflight for the `objective` node: component names, per-component kwargs, the composition.

The node holds one name per slot (`baseline`, `trust_region`, `aggregation`, `token_filter`)
and each component's hyperparameters under the component's own name (SCHEMA.md), so that
switching a component never carries another's settings. Checked here: every key is a slot or
a registered component name; every slot names a registered component (close matches
suggested); every kwarg exists in that component's constructor and is in range (delta >= 0
and not NaN, q in [0, 1], ...); finally the real `Objective` is composed from the node.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from frlab.config.errors import ConfigError, unknown
from frlab.config.schema import Field, check_value

SLOTS = ("baseline", "trust_region", "aggregation", "token_filter")

# Ranges for hyperparameters by kwarg name (shared by every component using that name).
KWARG_FIELDS: dict[str, Field] = {
    "delta": Field("float", low=0.0),  # inf admits every trajectory (no trust region)
    "q": Field("float", low=0.0, high=1.0),
    "eps": Field("float", low=0.0),
    "eps_low": Field("float", low=0.0, high=1.0),
    "eps_high": Field("float", low=0.0),
    "cap": Field("float", low=0.0, low_open=True),
    "lower": Field("float", low=0.0, low_open=True),
    "upper": Field("float", low=0.0, low_open=True),
    "length": Field("int", low=1),
}


def registries() -> dict[str, Any]:
    """Slot -> registry (importing frlab.objective registers every component)."""
    import frlab.objective  # noqa: F401  (registers the components)
    from frlab.objective.base import AGGREGATIONS, BASELINES, TOKEN_FILTERS, TRUST_REGIONS

    return {
        "baseline": BASELINES,
        "trust_region": TRUST_REGIONS,
        "aggregation": AGGREGATIONS,
        "token_filter": TOKEN_FILTERS,
    }


def check_objective(node: Mapping[str, Any]) -> Any:
    """Validate the resolved `objective` node and return the composed `Objective`."""
    regs = registries()
    components = sorted({name for reg in regs.values() for name in reg.names()})
    for key in node:
        if key not in SLOTS and key not in components:
            raise unknown(
                f"objective.{key}",
                "key in `objective` (a slot or a component name)",
                key,
                [*SLOTS, *components],
            )
    for slot, reg in regs.items():
        name = node.get(slot)
        if name is None:
            raise ConfigError(f"objective.{slot}", f"missing: name a {reg.kind}")
        if not isinstance(name, str):
            raise ConfigError(f"objective.{slot}", f"must be a component name, got {name!r}")
        if name not in reg:
            raise unknown(f"objective.{slot}", reg.kind, name, reg.names())
    for name in components:
        if name in node:
            _check_kwargs(name, node[name], [reg.get(name) for reg in regs.values() if name in reg])
    return _compose(node)


def _check_kwargs(name: str, kwargs: Any, classes: list[type]) -> None:
    key = f"objective.{name}"
    if kwargs is None:
        return
    if not isinstance(kwargs, Mapping):
        raise ConfigError(key, f"must be a mapping of {name}'s hyperparameters, got {kwargs!r}")
    allowed: set[str] = set()
    for cls in classes:
        params = inspect.signature(cls).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return
        allowed |= {p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL}
    for kw, value in kwargs.items():
        if kw not in allowed:
            raise unknown(f"{key}.{kw}", f"hyperparameter of {name!r}", kw, sorted(allowed))
        if kw in KWARG_FIELDS:
            check_value(f"{key}.{kw}", value, KWARG_FIELDS[kw])


def _compose(node: Mapping[str, Any]) -> Any:
    from frlab.objective import Objective
    from frlab.registry import RegistryError

    try:
        return Objective.from_config(node)
    except (RegistryError, ValueError, TypeError) as exc:
        raise ConfigError("objective", f"cannot compose the objective: {exc}") from exc
