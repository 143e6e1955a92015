"""What the chosen rollout engine must support, asked of the engine where it can say: a vLLM
whose platform is the CPU beside a CPU learner, the `rollout.weight_update` mode, LoRA
policies, the `rollout.vllm_engine_args` frlab owns, and the `rollout.remote` fleet block.
Every error is a ConfigError naming the key (called by frlab.config.preflight)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from frlab.config import schema
from frlab.config.declare import check_values
from frlab.config.errors import ConfigError, keyed

VLLM_ARGS_SET_BY_FRLAB = {"model", "seed", "max_model_len", "worker_extension_cls"}


def check_engine(engine: str, rollout: Mapping[str, Any], trainer: Mapping[str, Any]) -> None:
    node, device = rollout.get("engine") or {}, str(rollout.get("device", "cpu"))
    key = "rollout.device"
    if str(node.get("device", device)) != device:  # set on the engine node itself
        key, device = "rollout.engine.device", str(node.get("device"))
    cls = _engine_class(rollout)
    if device.split(":")[0] not in cls.devices:
        raise ConfigError(
            key,
            f"is {device!r}, but rollout/engine={engine} ({cls.__name__}) samples on "
            f"{' or '.join(d.upper() for d in cls.devices)} only: set rollout.device={cls.devices[0]}, "
            "or pick an "
            "engine that samples there",
        )
    try:
        cls.check_learner(str(trainer["accelerator"]))
    except ValueError as exc:
        raise ConfigError("rollout.engine", f"{engine!r}: {exc}") from exc
    extra = rollout.get("vllm_engine_args")
    if extra is None:
        return
    # Used only by rollout/engine=vllm; kept (not refused) when a preset's in-process vLLM
    # settings meet rollout=remote, so the fleet recipes run the presets unchanged.
    owned = sorted(set(extra) & VLLM_ARGS_SET_BY_FRLAB)
    if owned:
        raise ConfigError(
            "rollout.vllm_engine_args",
            f"{', '.join(owned)} are set by frlab (model.name_or_path, seed, rollout.max_len, "
            "the worker extension): remove them",
        )


def check_routing_replay(engine: str, rollout: Mapping[str, Any], model: Mapping[str, Any]) -> None:
    """`model.routing_replay` needs an engine class that records MoE routing (asked of it)."""
    if model.get("routing_replay") and not getattr(
        _engine_class(rollout), "records_routing", False
    ):
        able = " or ".join(f"rollout/engine={n}" for n in engines_that("records_routing"))
        raise ConfigError(
            "model.routing_replay",
            f"needs an engine that records MoE routing ({able}), got {engine!r}",
        )


def engines_that(capability: str) -> list[str]:
    """The rollout/engine options whose engine class declares `capability` true."""
    import dataclasses

    out = []
    for name, declaration in schema.ENGINES.items():
        target = {f.name: f.default for f in dataclasses.fields(declaration)}["_target_"]
        if getattr(_class_of(str(target)), capability, False):
            out.append(name)
    return out


def _engine_class(rollout: Mapping[str, Any]) -> Any:
    """The engine class a `rollout.engine` node builds."""
    return _class_of(str(rollout["engine"]["_target_"]))


def _class_of(target: str) -> Any:
    """The class behind an engine `_target_` (a `for_policy` classmethod, or the class)."""
    from hydra.utils import get_object

    owner = get_object(target)
    return getattr(owner, "__self__", owner)


def check_lora_engine(engine: str, rollout: Mapping[str, Any], model: Mapping[str, Any]) -> None:
    """`model.lora` needs an engine class that serves LoRA policies (asked of the class)."""
    from frlab.model.lora import check_lora, enabled

    lora = model.get("lora") or {}
    try:
        check_lora(lora)
    except ValueError as exc:
        raise keyed(exc) from exc
    if not enabled(lora):
        return
    cls = _engine_class(rollout)
    if not getattr(cls, "serves_lora", False):
        raise ConfigError(
            "model.lora.rank",
            f"the {engine} engine ({cls.__name__}) does not declare serves_lora: serve the "
            "adapter with an engine that does, or set model.lora.rank=0",
        )
    declared = getattr(cls, "lora_weight_updates", None)
    modes = tuple(declared()) if callable(declared) else None
    mode = rollout.get("weight_update")
    if mode is not None and modes is not None and mode not in modes:
        raise ConfigError(
            "rollout.weight_update",
            f"{mode!r} is not exact with model.lora on the {engine} engine, which implements "
            f"{', '.join(modes)} there",
        )


def check_weight_update(engine: str, rollout: Mapping[str, Any], model: Mapping[str, Any]) -> None:
    """A `rollout.weight_update` the engine class implements exactly (asked of the class, only
    when a mode is set: null is the engine's own default)."""
    mode = rollout.get("weight_update")
    if mode is None:
        return
    if mode == "resubmit" and model.get("routing_replay"):
        raise ConfigError(
            "rollout.weight_update",
            "resubmit re-prefills sampled tokens on the new weights, so a position would have "
            "two routings: not with model.routing_replay (use in_flight or drain)",
        )
    supported = getattr(_engine_class(rollout), "weight_updates", None)
    modes = tuple(supported()) if callable(supported) else ()
    if mode not in modes:
        raise ConfigError(
            "rollout.weight_update",
            f"{mode!r} is not exact on the {engine} engine, which implements "
            f"{', '.join(modes) or 'no named mode (leave it null)'}",
        )


def check_remote(engine: str, rollout: Mapping[str, Any], world: int) -> None:
    """The `rollout.remote` block: set exactly for an engine that reads a fleet, within its
    declared ranges, then the engine class's own checks (`Engine.check_settings`)."""
    cls, remote = _engine_class(rollout), rollout.get("remote")
    if remote is not None and not cls.reads_fleet:
        raise ConfigError(
            "rollout.engine",
            f"is {engine!r} but a rollout.remote block is set (rollout=remote): add "
            "rollout/engine=remote (or rollout.engine=remote; an experiment preset may pin "
            "the engine)",
        )
    if isinstance(remote, Mapping):
        check_values("rollout.remote", remote, schema.RemoteConfig)
    try:
        cls.check_settings(rollout, world)
    except ValueError as exc:
        raise keyed(exc) from exc
