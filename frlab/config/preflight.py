"""Preflight: check a composed config and resolve it into the plan's facts, before anything heavy.

Loads no model and imports no `transformers`. Every key meets its one declaration
(frlab.config.schema): types and unknown keys by OmegaConf (`structured`, `+`-added keys too),
ranges and choices by `check_values`, booleans on bool keys in the job's overrides. Then the
rules between keys (FlashREINFORCE paper, Sec. 3), each asked of its owner where it has one
(a ConfigError naming the key): the model loads or is random-initialised and the
context leaves room for the prompt (frlab.model.hub), the batch splits over ranks,
micro-batches and whole groups (frlab.data.batch), the lr schedule spans the run
(frlab.learner.optim), the engine class checks its own settings (`Engine.check_config`:
devices, learner, routing, LoRA, weight-update modes, the fleet and its secret), the
evaluation kind its node (frlab.evaluation.checks). Here: off-policy correction needs the
sampler's full support (top_p 1, top_k 0), group baselines several samples per prompt, async
weights arrive within the lag bound; the env node's keys bind to its class. Every error is a
`ConfigError` naming the full key.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from frlab.config import schema
from frlab.config.compose import group_options, locate, suggest_moved
from frlab.config.declare import (
    check_booleans,
    check_node,
    check_values,
    declared,
    declared_bool,
    is_boolean,
    section_type,
)
from frlab.config.errors import from_omegaconf
from frlab.config.plan import plan_facts
from frlab.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Checked:
    """What preflight hands the build: the resolved sections (plain containers), the run's one
    `Objective`, the number of learner ranks and the plan (a report of them)."""

    sections: dict[str, Any]
    objective: Any
    world: int
    plan: dict[str, Any]


def preflight(cfg: DictConfig) -> dict[str, Any]:
    """Check `cfg` (a frlab config, see `structured`); return the plan's facts."""
    return check_config(cfg).plan


def check_config(cfg: DictConfig) -> Checked:
    """Check `cfg` (a frlab config, see `structured`): every ConfigError before anything is
    built; returns what the build uses."""
    from frlab.data.batch import check_batch, world_size
    from frlab.learner.optim import check_schedule
    from frlab.model.hub import check_model

    cfg = structured(cfg)
    check_booleans(_job_overrides(cfg))
    own = [f.name for f, a in declared(schema.FrlabConfig) if a is not Any and not section_type(a)]
    values = OmegaConf.to_container(OmegaConf.masked_copy(cfg, own), resolve=True)
    check_values("", values, schema.FrlabConfig)  # type: ignore[arg-type]
    sec = {name: _resolve(cfg, name) for name in (*schema.SECTIONS, "objective")}
    for name, cls in schema.SECTIONS.items():
        check_values(name, sec[name], cls)
    engine = _engine_option(sec["rollout"])
    _check_nodes(cfg)
    # the owners' rules, each a ConfigError naming its key
    world = world_size(sec["trainer"])
    check_model(sec["model"], sec["rollout"])
    check_batch(sec["data"], sec["rollout"], world)
    check_schedule(sec["optim"], sec["trainer"]["max_steps"])
    # the engine class's own rules, asked of the class (never its name)
    locate_engine(sec["rollout"]).check_config(
        sec, world, {n: d._target_ for n, d in schema.ENGINES.items()}
    )
    _check_lag(sec["rollout"])
    _check_eval(cfg, sec["rollout"], sec["trainer"])
    objective = check_objective(sec["objective"])
    _check_support(objective, sec["rollout"]["sampling"])
    _check_groups(objective, sec["rollout"])
    return Checked(sec, objective, world, plan_facts(cfg, sec, objective, world, engine))


def structured(cfg: DictConfig) -> DictConfig:
    """`cfg` merged onto frlab's declarations (with the declared engine and fleet nodes it
    names), so OmegaConf checks its types and keys: those of a config built in Python or read
    from a run folder, and the keys a command line added with `+` to a composed one. A key it
    leaves out takes its declared default; a composed config is returned as it is once it
    passed. Errors are ConfigErrors naming the key."""
    target = OmegaConf.select(cfg, "rollout.engine._target_", default=None)
    found = schema.declaration_of(target)
    engine = found[1] if found is not None and found[1] in schema.ENGINES.values() else None
    rollout = schema.RolloutConfig(engine=None if engine is None else engine())
    if OmegaConf.select(cfg, "rollout.remote", default=None) is not None:
        rollout.remote = schema.RemoteConfig()
    values = OmegaConf.to_container(cfg, resolve=False)  # a typed node keeps its own keys
    values.pop("hydra", None)  # type: ignore[union-attr]
    try:
        out = OmegaConf.merge(OmegaConf.structured(schema.FrlabConfig(rollout=rollout)), values)
    except OmegaConfBaseException as exc:
        raise suggest_moved(from_omegaconf(exc)) from exc
    if OmegaConf.get_type(cfg) is schema.FrlabConfig:  # composed: typed already
        return cfg
    if "hydra" in cfg:
        with open_dict(out):
            out.hydra = cfg.hydra
    return out  # type: ignore[return-value]


def _job_overrides(cfg: DictConfig) -> Iterator[tuple[str, Any]]:
    """(key, value) of this job's overrides on a key declared bool (the command line's, with a
    sweep's values for this job: from the composed `hydra` node or the live run)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    if "hydra" in cfg:
        overrides = list(OmegaConf.select(cfg, "hydra.overrides.task", default=None) or [])
    else:
        overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    for override in OverridesParser.create().parse_overrides(overrides=overrides):
        key = override.key_or_group.lstrip("+")
        if override.is_delete() or not declared_bool(schema.FrlabConfig, key, schema.TYPED_NODES):
            continue
        if not override.is_discrete_sweep():
            value = override.value()
            yield key, value if is_boolean(value) else override.get_value_string()
            continue
        try:
            yield from ((key, value) for value in override.sweep_iterator())
        except HydraException:  # a glob() sweep: it lists group options, not values
            continue


def _resolve(cfg: DictConfig, section: str) -> dict[str, Any]:
    """The section as plain containers with interpolations resolved (errors name the key)."""
    node = cfg.get(section)
    if not isinstance(node, DictConfig):
        raise ConfigError(section, f"must be a mapping, got {node!r}")
    try:  # a `???` value (interpolations not followed: they resolve below)
        OmegaConf.to_container(node, resolve=False, throw_on_missing=True)
    except MissingMandatoryValue as exc:
        raise ConfigError(
            exc.full_key, "missing mandatory value (`???`): set it on the command line"
        ) from exc
    try:
        return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]
    except Exception as exc:  # interpolation errors carry the inner key
        raise ConfigError(section, f"cannot resolve: {exc}") from exc


def _engine_option(rollout: Mapping[str, Any]) -> str:
    """The engine node's rollout/engine option (its `_target_` for one not declared here),
    after its declared ranges and the fleet's."""
    if isinstance(rollout.get("remote"), Mapping):
        check_values("rollout.remote", rollout["remote"], schema.RemoteConfig)
    node, options = rollout.get("engine"), group_options("rollout/engine")
    if not isinstance(node, Mapping) or "_target_" not in node:
        named = isinstance(node, str) and node in options
        name = node if named else "NAME"
        raise ConfigError(
            "rollout.engine",
            f"{node!r} is not an engine node: the engine is the "
            f"config group rollout/engine (rollout/engine={name} on the command "
            f"line, `- override /rollout/engine: {name}` in a preset)",
            value=None if named else node,
            choices=options,
        )
    found = schema.declaration_of(node["_target_"])
    if found is None:
        return str(node["_target_"])
    check_values("rollout.engine", node, found[1])
    return found[0]


def locate_engine(rollout: Mapping[str, Any]) -> Any:
    """The engine class a `rollout.engine` node builds (a `for_policy` classmethod: its class)."""
    owner = locate(str(rollout["engine"]["_target_"]))
    return getattr(owner, "__self__", owner)


def _check_nodes(cfg: DictConfig) -> None:
    """`env` names its class and its keys bind to it; a logger and each callback name theirs."""
    env = cfg.get("env")
    if not isinstance(env, DictConfig) or "_target_" not in env:
        raise ConfigError("env._target_", "missing: the env group must name an environment class")
    logger = cfg.get("logger")
    if logger is not None and (not isinstance(logger, DictConfig) or "_target_" not in logger):
        raise ConfigError(
            "logger._target_", f"missing: choose logger={'|'.join(group_options('logger'))}"
        )
    callbacks = cfg.get("callbacks")
    if callbacks is not None and not isinstance(callbacks, DictConfig):
        raise ConfigError("callbacks", f"must be a mapping of name -> node, got {callbacks!r}")
    for name, node in (callbacks or {}).items():
        if node is not None and (not isinstance(node, DictConfig) or "_target_" not in node):
            raise ConfigError(f"callbacks.{name}._target_", "missing (or set the entry to null)")
        if node is not None and not isinstance(node.get("enabled", True), bool):
            raise ConfigError(
                f"callbacks.{name}.enabled", f"must be true or false, got {node.enabled!r}"
            )
    _check_env_args(env)


def _check_env_args(env: DictConfig) -> None:
    """The env node's keys bind to its `_target_`'s signature as the task samplers bind them
    (nothing is built), so a dry run catches `+env.tpyo=1`. A target this machine cannot import
    (a package installed only where the run goes) is left to the run, which names it."""
    target, keys = str(env._target_), [str(k) for k in env if not str(k).startswith("_")]
    try:
        signature = inspect.signature(locate(target))
    except (ImportError, ValueError, TypeError):  # not importable here, or no signature
        return
    try:
        signature.bind(**dict.fromkeys(keys))
    except TypeError as exc:
        params = signature.parameters
        extra = [k for k in keys if k not in params]
        if extra:
            raise ConfigError(
                f"env.{extra[0]}",
                f"unknown argument {extra[0]!r} of {target}",
                value=extra[0],
                choices=list(params),
            ) from None
        missing = [
            n
            for n, p in params.items()
            if p.default is p.empty
            and n not in keys
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if missing:
            raise ConfigError(
                f"env.{missing[0]}", f"missing: a required argument of {target}"
            ) from None
        raise ConfigError(
            "env._target_", f"{target} refuses the env node's arguments: {exc}"
        ) from None


def _check_lag(rollout: Mapping[str, Any]) -> None:
    """Async admission control needs weights within the lag bound."""
    every, lag = rollout["sync_every"], rollout["max_policy_lag"]
    if rollout["mode"] == "async" and every > lag:
        raise ConfigError(
            "rollout.sync_every",
            f"({every}) must be <= rollout.max_policy_lag "
            f"({lag}) in async mode: otherwise no rollout could finish within the "
            "lag bound and the pool would stall",
        )


def _check_eval(cfg: DictConfig, rollout: Mapping[str, Any], trainer: Mapping[str, Any]) -> None:
    """The `eval` node against the declaration of its kind, then the kind's own rules
    (frlab.evaluation.checks), then the run's: an interval it reaches, room for the prompt."""
    from frlab.evaluation.benchmarks import benchmark_specs
    from frlab.evaluation.checks import CHECKS

    node = cfg.get("eval")
    if node is None:
        return
    if not isinstance(node, DictConfig):
        raise ConfigError("eval", f"must be a mapping or null (eval=none), got {node!r}")
    values: dict[str, Any] = _resolve(cfg, "eval")
    kind = values.get("kind")
    if kind not in schema.EVALS:
        raise ConfigError(
            "eval.kind", f"unknown evaluation kind {kind!r}", value=kind, choices=schema.EVALS
        )
    found = schema.declaration_of(values.get("_target_"))
    other = [found[0]] if found is not None and found[1] in schema.EVALS.values() else []
    other = [k for k in other if k != kind]
    if other:
        raise ConfigError(
            "eval.kind",
            f"is {kind!r} but the node is a {other[0]} evaluation: "
            f"choose an eval option of kind {kind} (e.g. eval=math or "
            "eval=alfworld) instead of changing eval.kind",
        )
    values["benchmarks"] = benchmark_specs(values.get("benchmarks"))
    check_node("eval", values, schema.EVALS[kind])
    if not values["benchmarks"]:
        raise ConfigError("eval.benchmarks", "is empty: name at least one benchmark or eval=none")
    for name, bench in values["benchmarks"].items():
        if kind == "math" and isinstance(bench, Mapping):
            check_node(f"eval.benchmarks.{name}", bench, schema.MathBenchmarkConfig)
    env = OmegaConf.to_container(cfg.env, resolve=True)
    for warning in CHECKS[kind](values, env):  # type: ignore[arg-type]
        log.warning(warning)
    every, steps = values["every_n_steps"], trainer["max_steps"]
    if every > steps:
        raise ConfigError(
            "eval.every_n_steps",
            f"({every}) exceeds trainer.max_steps ({steps}): "
            "no evaluation would run; lower it or use eval=none",
        )
    new, max_len = values["sampling"]["max_new_tokens"], rollout["max_len"]
    if new >= max_len:
        raise ConfigError(
            "eval.sampling.max_new_tokens",
            f"({new}) must be below rollout.max_len ({max_len}) to leave room for the prompt",
        )


def check_objective(node: Mapping[str, Any]) -> Any:
    """The composed `Objective` of the resolved `objective` node; its own errors (unknown keys,
    names and hyperparameters) as ConfigErrors naming the key."""
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
        raise ConfigError(
            exc.key, f"unknown {exc.kind} {exc.name!r}", value=exc.name, choices=exc.choices
        ) from exc
    except HyperparameterError as exc:
        key = exc.key if exc.key.startswith("objective.") else f"objective.{exc.key}"
        raise ConfigError(key, exc.reason, value=exc.name, choices=exc.choices or None) from exc
    except (ValueError, TypeError) as exc:
        raise ConfigError("objective", f"cannot compose the objective: {exc}") from exc


def _check_support(objective: Any, sampling: Mapping[str, Any]) -> None:
    """Importance ratios need the full support of the sampling distribution (top_p 1, no top-k)."""
    if not objective.uses_off_policy_correction:
        return
    name = objective.names["trust_region"]
    if sampling["top_p"] != 1.0:
        raise ConfigError(
            "rollout.sampling.top_p",
            f"must be 1.0 with off-policy correction "
            f"(trust_region {name!r}); got {sampling['top_p']}: truncated sampling "
            "breaks importance sampling (use objective.trust_region=no_is to turn "
            "it off)",
        )
    if sampling["top_k"] != 0:
        raise ConfigError(
            "rollout.sampling.top_k",
            f"must be 0 (off) with off-policy correction "
            f"(trust_region {name!r}); got {sampling['top_k']}",
        )


def _check_groups(objective: Any, rollout: Mapping[str, Any]) -> None:
    g = rollout["samples_per_prompt"]
    if objective.is_group_baseline and g < 2:
        raise ConfigError(
            "rollout.samples_per_prompt",
            f"baseline "
            f"{objective.names['baseline']!r} compares sibling rollouts of a prompt "
            f"and needs samples_per_prompt > 1 (got {g}; with one sample its "
            "advantages are zero or undefined); use objective.baseline=batch_mean "
            "for one rollout per prompt",
        )
