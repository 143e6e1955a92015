"""Preflight for the `objective` node: component names, per-component kwargs, the composition.

The node holds one name per slot (`baseline`, `trust_region`, `aggregation`, `token_filter`)
and each component's hyperparameters under the component's own name, so that switching a
component never carries another's settings. Everything checked here is read from the
components' own declarations (`frlab.objective.base`): every key is a slot or a registered
component name; every slot names a registered component of its kind (close matches
suggested); every kwarg is a declared hyperparameter of that component and fits its declared
type and range; finally the real `Objective` is composed from the node (rules between
hyperparameters, e.g. geometric_ratio's lower <= upper). Every error is a `ConfigError`
naming the full key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from frlab.config.errors import ConfigError, unknown


def registries() -> dict[str, Any]:
    """Slot -> registry (importing frlab.objective registers every component)."""
    from frlab.objective import KINDS

    return dict(KINDS)


def check_objective(node: Mapping[str, Any]) -> Any:
    """Validate the resolved `objective` node and return the composed `Objective`."""
    regs = registries()
    slots = list(regs)  # the objective's own component kinds (frlab.objective.KINDS)
    components = sorted({name for reg in regs.values() for name in reg.names()})
    for key in node:
        if key not in slots and key not in components:
            raise unknown(
                f"objective.{key}",
                "key in `objective` (a slot or a component name)",
                key,
                [*slots, *components],
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
            classes = [reg.get(name) for reg in regs.values() if name in reg]
            _check_kwargs(name, node[name], classes)
    return _compose(node)


def _check_kwargs(name: str, kwargs: Any, classes: list[Any]) -> None:
    """kwargs of component `name` against its declared hyperparameters (all classes of that
    name: a name may be registered in several kinds, e.g. `none`)."""
    from frlab.objective import HyperparameterError

    key = f"objective.{name}"
    if kwargs is None:
        return
    if not isinstance(kwargs, Mapping):
        raise ConfigError(key, f"must be a mapping of {name}'s hyperparameters, got {kwargs!r}")
    specs = {h.name: h for cls in classes for h in cls.hyperparameters()}
    for kw, value in kwargs.items():
        if not specs:
            raise ConfigError(f"{key}.{kw}", f"{name!r} has no hyperparameters")
        if kw not in specs:
            raise unknown(f"{key}.{kw}", f"hyperparameter of {name!r}", kw, sorted(specs))
        try:
            specs[kw].check(value, f"{key}.{kw}")
        except HyperparameterError as exc:
            raise ConfigError(exc.key, exc.reason) from exc


def _compose(node: Mapping[str, Any]) -> Any:
    from frlab.objective import Objective
    from frlab.registry import RegistryError

    try:
        return Objective.from_config(node)
    except (RegistryError, ValueError, TypeError) as exc:
        raise ConfigError("objective", f"cannot compose the objective: {exc}") from exc
