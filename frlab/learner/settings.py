"""The learner's own settings, read from the `model`, `data` and `optim` config nodes.

Each bad value raises a ValueError naming its config key; `model` keys the learner does not
read itself go to `frlab.model.policy.build_policy`, whose signature decides what is known.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from frlab.model.policy import build_policy

# `model` keys the learner reads itself; everything else goes to build_policy.
LEARNER_MODEL_KEYS = ("tokenizer", "logprob_chunk_size", "routing_replay", "compile")


@dataclass(frozen=True)
class ModelSettings:
    """The `model` keys the learner reads itself (their defaults: the schema's)."""

    logprob_chunk_size: int = 1024
    routing_replay: bool = False
    compile: bool = False

    @classmethod
    def checked(cls, model: Mapping[str, Any]) -> ModelSettings:
        """From the `model` node; a bad value or combination is a ValueError naming the key."""
        settings = cls(
            positive_int("model.logprob_chunk_size", model.get("logprob_chunk_size", 1024)),
            flag("model.routing_replay", model.get("routing_replay", False)),
            flag("model.compile", model.get("compile", False)),
        )
        if settings.compile and settings.routing_replay:
            raise ValueError(
                "model.compile=true does not take model.routing_replay=true (the recorded "
                "experts are not padded like the compiled packed rows): set one to false"
            )
        return settings


def check_policy(policy: Any, settings: ModelSettings, pack: bool) -> None:
    """What the settings need of the policy: an MoE policy for routing replay, an attention
    implementation whose packed forward is exact for packing."""
    from frlab.model.packed_attention import check_packable
    from frlab.model.routing_replay import moe_routers

    if settings.routing_replay:
        try:
            moe_routers(policy)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"model.routing_replay=true needs an MoE policy: {exc}") from exc
    if pack:
        check_packable(policy)


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


def positive_number(name: str, value: Any) -> float:
    """`value` as a float if it is a finite number > 0 (not a bool), else ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return float(value)


def flag(name: str, value: Any) -> bool:
    """`value` if it is a bool, else ValueError naming `name`."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value
