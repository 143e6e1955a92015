"""A `RemoteEngine` as a Python caller builds one: from the declarations' defaults.

`remote_engine(servers, **changes)`: the fleet settings are `RemoteConfig`'s (the one
declaration of `rollout.remote`) with the `changes` that name its keys; `seed` and
`weight_update` default to the root's and `rollout`'s declared defaults; every other change
(`initial_weights`, `lora`, ...) goes to the constructor as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from frlab.config.schema import FrlabConfig, RemoteConfig, RolloutConfig
from frlab.rollout.remote.engine import RemoteEngine

FLEET_KEYS = frozenset(f.name for f in dataclasses.fields(RemoteConfig))


def fleet_settings(servers: Sequence[str], **changes: Any) -> dict[str, Any]:
    """The `rollout.remote` keys at their declared defaults, with `changes`."""
    unknown = set(changes) - FLEET_KEYS
    if unknown:
        raise TypeError(f"not rollout.remote keys: {sorted(unknown)}")
    return dataclasses.asdict(RemoteConfig(servers=list(servers), **changes))


def remote_engine(servers: Sequence[str], **changes: Any) -> RemoteEngine:
    fleet = fleet_settings(servers, **{k: v for k, v in changes.items() if k in FLEET_KEYS})
    run = {"seed": FrlabConfig.seed, "weight_update": RolloutConfig.weight_update}
    rest = {k: v for k, v in changes.items() if k not in FLEET_KEYS}
    return RemoteEngine(**fleet, **{**run, **rest})
