"""The learner's own settings, read from the `model`, `data` and `optim` config nodes.

Each bad value raises a ValueError naming its config key; `model` keys the learner does not
read itself go to `frlab.model.policy.build_policy`, whose signature decides what is known.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from frlab.model.policy import build_policy

# `model` keys the learner reads itself; everything else goes to build_policy.
LEARNER_MODEL_KEYS = ("tokenizer", "logprob_chunk_size", "routing_replay")


def mapping_copy(node: Mapping[str, Any] | None, name: str) -> dict[str, Any]:
    """A plain-dict copy of a config node (OmegaConf resolved); ValueError naming `name`."""
    if node is None:
        return {}
    if type(node).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        node = OmegaConf.to_container(node, resolve=True)  # type: ignore[assignment]
    if not isinstance(node, Mapping):
        raise ValueError(f"{name} must be a mapping, got {type(node).__name__}")
    return {
        k: (mapping_copy(v, f"{name}.{k}") if isinstance(v, Mapping) else v)
        for k, v in node.items()
    }


def policy_kwargs(model: Mapping[str, Any]) -> dict[str, Any]:
    """The `model` node minus learner-only keys; unknown keys raise ValueError naming them."""
    accepted = set(inspect.signature(build_policy).parameters)
    kwargs = {k: v for k, v in model.items() if k not in LEARNER_MODEL_KEYS}
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        known = sorted(accepted | set(LEARNER_MODEL_KEYS))
        raise ValueError(
            f"unknown key(s) model.{', model.'.join(unknown)}; known: {', '.join(known)}"
        )
    return kwargs


def positive_int(name: str, value: Any) -> int:
    """`value` if it is an int >= 1 (not a bool), else ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def flag(name: str, value: Any) -> bool:
    """`value` if it is a bool, else ValueError naming `name`."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value
