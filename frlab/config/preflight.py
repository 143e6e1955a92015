"""Preflight: validate a composed config and resolve it into a `Plan`, before anything heavy.

Loads no model and imports no `transformers`: torch comes in with `frlab.objective` (the
component registries, after every lighter check) and the chosen engine's class, asked what it
supports; once imported, a check takes well under a second. Every key is
checked against its one declaration (frlab.config.schema): types and unknown keys by
OmegaConf (`structured`), ranges and choices by `frlab.config.declare.check_values`; then the
cross-field rules of the method (FlashREINFORCE paper, Sec. 3):

- the global batch B splits evenly over ranks and each rank's share over micro-batches; each
  rank's share B / W is a whole number of groups of `rollout.samples_per_prompt` (each rank's
  pool collects whole groups), and `rollout.max_in_flight` holds at least one group;
- off-policy correction (token importance ratios) needs the sampler's full support, so
  `rollout.sampling.top_p == 1` and `rollout.sampling.top_k == 0`;
- group baselines (GRPO, RLOO, Dr. GRPO) need `rollout.samples_per_prompt > 1` (in either
  collection mode: the async pool admits a prompt's samples together and batches whole groups;
  `batch_mean` with one sample per prompt is the paper's case);
- in async mode weights reach the engine at least every `rollout.max_policy_lag` steps
  (`rollout.sync_every <= rollout.max_policy_lag`), else admission control stalls;
- a trajectory's context (`rollout.max_len`) leaves room for the prompt beyond one turn's
  generation budget (`rollout.sampling.max_new_tokens`);
- the lr schedule (`optim.schedule_steps`, default `trainer.max_steps`) is at least as long as
  the run: a preset may stop at a headline step before the reference's schedule ends;
- a model is either loaded (`model.name_or_path`, which must exist when it is a local path)
  or random-initialised from `model.config`, not both;
- what the chosen engine supports is asked of its class (frlab.config.engines): the devices
  it samples on, the learner it serves beside, MoE routing records for `model.routing_replay`,
  the `rollout.weight_update` modes and LoRA policies; a refusal names the engines that do;
- `rollout/engine=remote` needs the `rollout.remote` block (`rollout=remote`) with a list of
  distinct http(s) server URLs; filesystem weight sync serves any number of learner ranks
  (they share the fleet), nccl exactly one (the single NCCL sender); a `remote` block under
  another engine is refused (an experiment preset may have pinned the engine); a fleet with a
  server off loopback needs a shared secret (`rollout.remote.secret_env` / `secret_file`,
  read here) unless `rollout.remote.allow_unauthenticated=true`;
- every `_target_` is on the instantiation allowlist (frlab.config.instantiate), with the
  packages of `user_modules`; the `env` node's keys are arguments of its class (its signature:
  an unknown or missing one is named, nothing is built);
- the optional `eval` node (avg@k during training) is checked by `frlab.config.evaluation`;
- the `objective` node checks itself (`Objective.from_config`): one component name per slot,
  each component's hyperparameters under its own name; a slot left empty is refused.

Every error is a `ConfigError` naming the full key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from frlab.config import schema
from frlab.config.compose import group_options
from frlab.config.declare import (
    check_bool_overrides,
    check_values,
    declared,
    non_booleans,
    section_type,
)
from frlab.config.engines import (
    ENGINES,
    TYPED_NODES,
    RemoteConfig,
    check_engine,
    check_lora_engine,
    check_remote,
    check_routing_replay,
    check_weight_update,
    engine_name,
)
from frlab.config.errors import ConfigError, engine_named, unknown
from frlab.config.evaluation import check_eval
from frlab.config.instantiate import check_allowed, check_user_modules, locate
from frlab.config.plan import Plan, build_plan
from frlab.config.schema_trainer import world_size
from frlab.model.hub import local_source_problem

__all__ = ["ConfigError", "Plan", "preflight"]


def preflight(cfg: DictConfig) -> Plan:
    """Validate `cfg` (a frlab config, see `structured`) and return the resolved run plan."""
    cfg = structured(cfg)
    check_bool_overrides(schema.FrlabConfig, _job_overrides(cfg), TYPED_NODES)  # a sweep's too
    _check_root(cfg)
    sec = {name: _resolve(cfg, name) for name in ("model", "rollout", "data", "objective", "optim")}
    trainer = _resolve(cfg, "trainer")
    root = {**sec, "trainer": trainer}
    for name, cls in schema.SECTIONS.items():
        check_values(name, root[name], cls)
    user_modules = check_user_modules(cfg.get("user_modules") or [])
    engine = _check_engine_node(sec["rollout"])
    _check_infrastructure(cfg, user_modules)
    world = world_size(trainer)
    _check_model(sec["model"], sec["rollout"], engine)
    _check_batch(sec["data"], sec["rollout"], world)
    _check_sync(sec["rollout"])
    check_engine(engine, sec["rollout"], trainer)
    check_weight_update(engine, sec["rollout"], sec["model"])
    check_lora_engine(engine, sec["rollout"], sec["model"])
    check_remote(engine, sec["rollout"], world)
    _check_schedule(sec["optim"], trainer)
    check_eval(cfg, sec["rollout"], trainer)
    objective = check_objective(sec["objective"])
    _check_support(objective, sec["rollout"]["sampling"])
    _check_groups(objective, sec["rollout"], sec["data"])
    return build_plan(cfg, sec, trainer, objective, world, engine)


def _job_overrides(cfg: DictConfig) -> list[str]:
    """This job's overrides: the command line's, with a sweep's values for this job (from the
    composed `hydra` node, or the live run's)."""
    from hydra.core.hydra_config import HydraConfig

    if "hydra" in cfg:
        return list(OmegaConf.select(cfg, "hydra.overrides.task", default=None) or [])
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def _resolve(cfg: DictConfig, section: str) -> dict[str, Any]:
    """The section as plain containers with interpolations resolved (errors name the key)."""
    if section not in cfg or cfg[section] is None:
        raise ConfigError(section, "missing section")
    node = cfg[section]
    if not isinstance(node, DictConfig):
        raise ConfigError(section, f"must be a mapping, got {node!r}")
    missing = _missing_keys(node, section)
    if missing:
        raise ConfigError(missing[0], "missing mandatory value (`???`): set it on the command line")
    try:
        return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]
    except Exception as exc:  # interpolation errors carry the inner key
        raise ConfigError(section, f"cannot resolve: {exc}") from exc


def _missing_keys(node: DictConfig, prefix: str) -> list[str]:
    """Full keys of `???` values below `node` (interpolations are not followed)."""
    out: list[str] = []
    for key in node:
        full = f"{prefix}.{key}"
        if OmegaConf.is_missing(node, key):
            out.append(full)
            continue
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            out += _missing_keys(child, full)
    return sorted(out)


def structured(cfg: DictConfig) -> DictConfig:
    """`cfg` merged onto frlab's declarations (with the declared engine and fleet nodes it
    names), so OmegaConf checks its types and keys: those of a config built in Python or
    loaded from a run folder, and the keys a command line added with `+` to a composed one.
    A key a config leaves out takes its declared default. A composed config is returned as it
    is once it passed. Errors are ConfigErrors naming the key."""
    from frlab.config.errors import omegaconf_error

    declaration = ENGINES.get(
        engine_name({"_target_": OmegaConf.select(cfg, "rollout.engine._target_", default=None)})
    )
    rollout = schema.RolloutConfig(engine=None if declaration is None else declaration())
    if OmegaConf.select(cfg, "rollout.remote", default=None) is not None:
        rollout.remote = RemoteConfig()
    # as plain containers (interpolations kept): a typed node would carry its own extra keys
    values = OmegaConf.to_container(cfg, resolve=False)
    values.pop("hydra", None)  # type: ignore[union-attr]
    if OmegaConf.get_type(cfg) is not schema.FrlabConfig:  # raw values: not yet converted
        for key, value in non_booleans(schema.FrlabConfig, values, TYPED_NODES):  # type: ignore[arg-type]
            raise ConfigError(key, f"must be true or false, got {value!r}")
    try:
        out = OmegaConf.merge(OmegaConf.structured(schema.FrlabConfig(rollout=rollout)), values)
    except OmegaConfBaseException as exc:
        raise omegaconf_error(exc) from exc
    if OmegaConf.get_type(cfg) is schema.FrlabConfig:
        return cfg
    if "hydra" in cfg:
        with open_dict(out):
            out.hydra = cfg.hydra
    return out  # type: ignore[return-value]


def _check_root(cfg: DictConfig) -> None:
    """The declared rules of the root's own keys (the sections are checked one by one)."""
    own = [f.name for f, a in declared(schema.FrlabConfig) if a is not Any and not section_type(a)]
    values = OmegaConf.to_container(OmegaConf.masked_copy(cfg, own), resolve=True)
    check_values("", values, schema.FrlabConfig)  # type: ignore[arg-type]


def _check_engine_node(rollout: Mapping[str, Any]) -> str:
    """The engine node is one of the rollout/engine options (or a user engine): its name."""
    node = rollout.get("engine")
    if isinstance(node, str):
        raise engine_named(node)
    if not isinstance(node, Mapping) or "_target_" not in node:
        raise ConfigError(
            "rollout.engine",
            f"must be an engine node (rollout/engine={'|'.join(ENGINES)}), got {node!r}",
        )
    name = engine_name(node)
    if name in ENGINES:
        check_values("rollout.engine", node, ENGINES[name])
    return name


def _check_infrastructure(cfg: DictConfig, user_modules: tuple[str, ...]) -> None:
    """`_target_` nodes: env needs one; every target (logger, callbacks too) on the allowlist."""
    env = cfg.get("env")
    if not isinstance(env, DictConfig) or "_target_" not in env:
        raise ConfigError("env._target_", "missing: the env group must name an environment class")
    nodes = {"env": env, "model": cfg.model, "data": cfg.data, "optim": cfg.optim,
             "trainer": cfg.trainer, "rollout.engine": cfg.rollout.engine}  # fmt: skip
    logger = cfg.get("logger")
    if logger is not None:
        if not isinstance(logger, DictConfig) or "_target_" not in logger:
            options = "|".join(group_options("logger"))
            raise ConfigError("logger._target_", f"missing: choose logger={options}")
        nodes["logger"] = logger
    callbacks = cfg.get("callbacks")
    if callbacks is not None:
        if not isinstance(callbacks, DictConfig):
            raise ConfigError("callbacks", f"must be a mapping of name -> node, got {callbacks!r}")
        for name, node in callbacks.items():
            if node is not None and (not isinstance(node, DictConfig) or "_target_" not in node):
                raise ConfigError(
                    f"callbacks.{name}._target_", "missing (or set the entry to null)"
                )
            if node is not None and not isinstance(node.get("enabled", True), bool):
                raise ConfigError(
                    f"callbacks.{name}.enabled", f"must be true or false, got {node.enabled!r}"
                )
        nodes["callbacks"] = callbacks
    if isinstance(cfg.get("eval"), DictConfig):
        nodes["eval"] = cfg.eval
    for key, node in nodes.items():
        check_allowed(node, key, user_modules)
    _check_env_args(env)


def _check_env_args(env: DictConfig) -> None:
    """The env node's keys bind to its `_target_`'s signature as the task samplers bind them
    (`envs.base.init_arguments`; nothing is built), so a dry run catches `+env.tpyo=1`; the
    refused key is named. A target this machine cannot import (a user package installed only
    where the run goes) is left to the run, which names it."""
    import inspect

    from envs.base import init_arguments

    target = str(env._target_)
    keys = [str(k) for k in env if not str(k).startswith("_")]
    try:
        built_by = locate(target)
        params = inspect.signature(built_by).parameters
    except (ImportError, ValueError, TypeError):  # not importable here, or no signature
        return
    try:
        init_arguments(built_by, dict.fromkeys(keys))
    except TypeError as exc:
        unknown_keys = [k for k in keys if k not in params]
        if unknown_keys:
            key = unknown_keys[0]
            raise ConfigError(f"env.{key}", f"unknown argument {key!r} of {target}", value=key,
                              choices=list(params)) from None  # fmt: skip
        variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        missing = [n for n, p in params.items()
                   if p.default is p.empty and p.kind not in variadic and n not in keys]  # fmt: skip
        if missing:
            raise ConfigError(
                f"env.{missing[0]}", f"missing: a required argument of {target}"
            ) from None
        raise ConfigError(
            "env._target_", f"{target} refuses the env node's arguments: {exc}"
        ) from None


def _check_model(model: Mapping[str, Any], rollout: Mapping[str, Any], engine: str) -> None:
    source, config = model["name_or_path"], model["config"]
    if source is None and config is None:
        raise ConfigError("model.name_or_path", "set a hub id / local folder, or model.config")
    if source is not None:
        problem = local_source_problem(str(source))
        if problem:
            raise ConfigError("model.name_or_path", problem)
    if source is not None and config is not None:
        raise ConfigError(
            "model.config",
            f"is set (a random-init architecture) while model.name_or_path loads {source!r}: "
            "choose one (model=hf model.name_or_path=... loads a checkpoint; "
            "model.name_or_path=null keeps the random-init model)",
        )
    if config is not None and "model_type" not in config:
        raise ConfigError("model.config.model_type", "missing (e.g. qwen2, llama, qwen3_moe)")
    max_len = rollout["max_len"]
    new = rollout["sampling"]["max_new_tokens"]
    if max_len <= new:
        raise ConfigError(
            "rollout.max_len",
            f"({max_len}) must exceed rollout.sampling.max_new_tokens ({new}) to leave room "
            "for the prompt",
        )
    positions = (config or {}).get("max_position_embeddings")
    if isinstance(positions, int) and max_len > positions:
        raise ConfigError(
            "rollout.max_len",
            f"({max_len}) exceeds model.config.max_position_embeddings ({positions})",
        )
    check_routing_replay(engine, rollout, model)


def _check_batch(data: Mapping[str, Any], rollout: Mapping[str, Any], world: int) -> None:
    from frlab.data.batch import per_rank_batch

    b, micro = data["batch_size"], data["micro_batch_size"]
    try:
        per_rank = per_rank_batch(b, world)
    except ValueError as exc:
        raise ConfigError("data.batch_size", str(exc).removeprefix("data.batch_size ")) from exc
    if per_rank % micro:
        raise ConfigError(
            "data.micro_batch_size",
            f"({micro}) must divide the per-rank batch data.batch_size / ranks = {per_rank}",
        )
    g = rollout["samples_per_prompt"]
    if b % g:
        raise ConfigError(
            "data.batch_size",
            f"({b}) must be a multiple of rollout.samples_per_prompt ({g}): whole groups per batch",
        )
    if per_rank % g:
        raise ConfigError(
            "rollout.samples_per_prompt",
            f"({g}) must divide the per-rank batch data.batch_size / ranks = {b} / {world} = "
            f"{per_rank}: each rank's pool collects whole groups of {g} rollouts into its "
            f"{per_rank} trajectories; use data.batch_size a multiple of {g * world} or fewer "
            "samples per prompt",
        )
    if rollout["max_in_flight"] < g:
        raise ConfigError(
            "rollout.max_in_flight",
            f"({rollout['max_in_flight']}) must be >= rollout.samples_per_prompt ({g}): a "
            "group's rollouts are started together",
        )


def check_objective(node: Mapping[str, Any]) -> Any:
    """The composed `Objective` of the resolved `objective` node; its own errors (unknown keys,
    names and hyperparameters, chosen components or not) as ConfigErrors naming the key."""
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


def _check_support(objective: Any, sampling: Mapping[str, Any]) -> None:
    """Importance ratios need the full support of the sampling distribution (top_p 1, no top-k)."""
    if not objective.uses_off_policy_correction:
        return
    if sampling["top_p"] != 1.0:
        raise ConfigError(
            "rollout.sampling.top_p",
            f"must be 1.0 with off-policy correction (trust_region "
            f"{objective.names['trust_region']!r}); got {sampling['top_p']}: truncated sampling "
            "breaks importance sampling (use objective.trust_region=no_is to turn it off)",
        )
    if sampling["top_k"] != 0:
        raise ConfigError(
            "rollout.sampling.top_k",
            f"must be 0 (off) with off-policy correction (trust_region "
            f"{objective.names['trust_region']!r}); got {sampling['top_k']}",
        )


def _check_groups(objective: Any, rollout: Mapping[str, Any], data: Mapping[str, Any]) -> None:
    g = rollout["samples_per_prompt"]
    if objective.is_group_baseline and g < 2:
        raise ConfigError(
            "rollout.samples_per_prompt",
            f"baseline {objective.names['baseline']!r} compares sibling rollouts of a prompt and "
            f"needs samples_per_prompt > 1 (got {g}; with one sample its advantages are zero or "
            "undefined); use objective.baseline=batch_mean for one rollout per prompt",
        )


def _check_sync(rollout: Mapping[str, Any]) -> None:
    """Async admission control needs weights pushed at least every `max_policy_lag` steps."""
    every, lag = rollout["sync_every"], rollout["max_policy_lag"]
    if rollout["mode"] == "async" and every > lag:
        raise ConfigError(
            "rollout.sync_every",
            f"({every}) must be <= rollout.max_policy_lag ({lag}) in async mode: otherwise no "
            "rollout could finish within the lag bound and the pool would stall",
        )


def _check_schedule(optim: Mapping[str, Any], trainer: Mapping[str, Any]) -> None:
    """A run may stop before the end of its lr schedule, never run past it."""
    length, steps = optim.get("schedule_steps"), trainer["max_steps"]
    if length is not None and length < steps:
        raise ConfigError(
            "optim.schedule_steps",
            f"({length}) is shorter than trainer.max_steps ({steps}): the run would continue "
            "past the end of its lr schedule; set optim.schedule_steps >= trainer.max_steps "
            "(null: the schedule spans trainer.max_steps)",
        )
