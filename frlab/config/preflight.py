"""Preflight: validate a composed config and resolve it into a `Plan`, before anything heavy.

Runs in well under a second, loads no model and imports no `transformers` (only
`frlab.objective`, for the component registries). It resolves every component name, checks
every parameter (type, range, unknown keys with close-match suggestions) and the cross-field
rules of the method (FlashREINFORCE paper; SPEC §2-3):

- the global batch B splits evenly over ranks and each rank's share over micro-batches; each
  rank's share B / W is a whole number of groups of `rollout.samples_per_prompt` (each rank's
  pool collects whole groups), and `rollout.max_in_flight` holds at least one group;
- off-policy correction (token importance ratios) needs the sampler's full support, so
  `rollout.sampling.top_p == 1` and `rollout.sampling.top_k == 0`;
- group baselines (GRPO, RLOO, Dr. GRPO) need `rollout.samples_per_prompt > 1`, which only the
  `sync` collection mode provides (the async pool runs one rollout per prompt; `batch_mean`
  with one sample per prompt is the paper's case);
- in async mode weights reach the engine at least every `rollout.max_policy_lag` steps
  (`rollout.sync_every <= rollout.max_policy_lag`), else admission control stalls;
- a trajectory's context (`rollout.max_len`) leaves room for the prompt beyond one turn's
  generation budget (`rollout.sampling.max_new_tokens`).
- MoE routing replay (`model.routing_replay`) needs `rollout.engine=torch`, the engine that
  records the experts it used.
- `rollout.engine=remote` needs the `rollout.remote` block (`rollout=remote`) with a list of
  distinct http(s) server URLs; filesystem weight sync serves any number of learner ranks
  (they share the fleet), nccl exactly one (the single NCCL sender); a `remote` block under another engine is refused (an experiment preset may
  have pinned the engine).
- the optional `eval` node (avg@k during training) is checked by
  `frlab.config.eval_check` (interval within `trainer.max_steps`, generation budget).

Every error is a `ConfigError` naming the full key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from frlab.config import schema
from frlab.config.errors import ConfigError, unknown
from frlab.config.eval_check import check_eval
from frlab.config.instantiate import check_allowed
from frlab.config.objective_check import check_objective
from frlab.config.plan import Plan, build_plan

__all__ = ["ConfigError", "Plan", "preflight"]


def preflight(cfg: DictConfig) -> Plan:
    """Validate `cfg` (a composed frlab config) and return the resolved run plan."""
    _check_root(cfg)
    sec = {name: _resolve(cfg, name) for name in ("model", "rollout", "data", "objective", "optim")}
    trainer = _resolve(cfg, "trainer")
    schema.check_section("model", sec["model"], schema.MODEL)
    schema.check_section("rollout", sec["rollout"], schema.ROLLOUT)
    schema.check_section("rollout.sampling", sec["rollout"]["sampling"], schema.SAMPLING)
    schema.check_section("data", sec["data"], schema.DATA)
    schema.check_section("optim", sec["optim"], schema.OPTIM)
    schema.check_trainer(trainer)
    _check_infrastructure(cfg)
    objective = check_objective(sec["objective"])
    world = schema.world_size(trainer)
    _check_model(sec["model"], sec["rollout"])
    _check_batch(sec["data"], sec["rollout"], world)
    _check_support(objective, sec["rollout"]["sampling"])
    _check_groups(objective, sec["rollout"], sec["data"])
    _check_sync(sec["rollout"])
    _check_engine(sec["rollout"], trainer)
    _check_remote(sec["rollout"], world)
    check_eval(cfg, sec["rollout"], trainer)
    return build_plan(cfg, sec, trainer, objective, world)


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


def _check_root(cfg: DictConfig) -> None:
    for key in cfg:
        if key not in schema.ROOT_KEYS:
            raise unknown(str(key), "top-level key", key, schema.ROOT_KEYS)
    specs = {
        "seed": schema.Field("int", low=0),
        "dry_run": schema.Field("bool"),
        "ckpt_path": schema.Field("str", optional=True),
        "task_name": schema.Field("str"),
        "plots": schema.Field("bool"),
    }
    for key, spec in specs.items():
        if key not in cfg:
            raise ConfigError(key, "missing (required key)")
        schema.check_value(key, cfg[key], spec)


def _check_infrastructure(cfg: DictConfig) -> None:
    """`_target_` nodes: env needs one; every target (logger, callbacks too) on the allowlist."""
    env = cfg.get("env")
    if not isinstance(env, DictConfig) or "_target_" not in env:
        raise ConfigError("env._target_", "missing: the env group must name an environment class")
    check_allowed(env, "env")
    logger = cfg.get("logger")
    if logger is not None:
        if not isinstance(logger, DictConfig) or "_target_" not in logger:
            raise ConfigError("logger._target_", "missing: choose logger=csv|tensorboard|wandb")
        check_allowed(logger, "logger")
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
        check_allowed(callbacks, "callbacks")
    check_allowed(cfg.trainer, "trainer")


def _check_model(model: Mapping[str, Any], rollout: Mapping[str, Any]) -> None:
    if model["name_or_path"] is None and model["config"] is None:
        raise ConfigError("model.name_or_path", "set a hub id / local folder, or model.config")
    if model["config"] is not None and "model_type" not in model["config"]:
        raise ConfigError("model.config.model_type", "missing (e.g. qwen2, llama, qwen3_moe)")
    max_len = rollout["max_len"]
    new = rollout["sampling"]["max_new_tokens"]
    if max_len <= new:
        raise ConfigError(
            "rollout.max_len",
            f"({max_len}) must exceed rollout.sampling.max_new_tokens ({new}) to leave room "
            "for the prompt",
        )
    positions = (model["config"] or {}).get("max_position_embeddings")
    if isinstance(positions, int) and max_len > positions:
        raise ConfigError(
            "rollout.max_len",
            f"({max_len}) exceeds model.config.max_position_embeddings ({positions})",
        )
    if model.get("routing_replay") and rollout["engine"] != "torch":
        raise ConfigError(
            "model.routing_replay",
            f"needs rollout.engine=torch (the only engine that records MoE routing), got "
            f"{rollout['engine']!r}",
        )


def _check_batch(data: Mapping[str, Any], rollout: Mapping[str, Any], world: int) -> None:
    b, micro = data["batch_size"], data["micro_batch_size"]
    if b % world:
        raise ConfigError(
            "data.batch_size",
            f"({b}) must be divisible by the number of ranks, trainer.devices x "
            f"trainer.num_nodes = {world}",
        )
    per_rank = b // world
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


def _check_support(objective: Any, sampling: Mapping[str, Any]) -> None:
    """Importance ratios need the full support of the sampling distribution (SPEC §3)."""
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
    if g > 1 and rollout["mode"] != "sync":
        raise ConfigError(
            "rollout.mode",
            f"samples_per_prompt={g} needs mode 'sync' (collect whole groups, then train); the "
            "async pool runs one rollout per prompt",
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


VLLM_ARGS_SET_BY_FRLAB = {"model", "seed", "max_model_len", "worker_extension_cls"}


def _check_engine(rollout: Mapping[str, Any], trainer: Mapping[str, Any]) -> None:
    if rollout["engine"] == "vllm" and trainer["accelerator"] not in ("gpu", "cuda", "auto"):
        raise ConfigError(
            "rollout.engine",
            f"'vllm' needs a GPU trainer (trainer.accelerator is {trainer['accelerator']!r}); "
            "use rollout.engine=torch on CPU",
        )
    extra = rollout.get("vllm_engine_args")
    if extra is None:
        return
    # Used only by rollout.engine=vllm; kept (not refused) when a preset's in-process vLLM
    # settings meet rollout=remote, so the fleet recipes run the presets unchanged.
    owned = sorted(set(extra) & VLLM_ARGS_SET_BY_FRLAB)
    if owned:
        raise ConfigError(
            "rollout.vllm_engine_args",
            f"{', '.join(owned)} are set by frlab (model.name_or_path, seed, rollout.max_len, "
            "the worker extension): remove them",
        )


def _check_remote(rollout: Mapping[str, Any], world: int) -> None:
    """The `rollout.remote` block: present exactly with engine=remote, servers well formed."""
    remote = rollout.get("remote")
    if rollout["engine"] != "remote":
        if remote is not None:
            raise ConfigError(
                "rollout.engine",
                f"is {rollout['engine']!r} but a rollout.remote block is set (rollout=remote): "
                "add rollout.engine=remote (an experiment preset may pin the engine)",
            )
        return
    if remote is None:
        raise ConfigError("rollout.remote", "missing: select the backend with rollout=remote")
    schema.check_section("rollout.remote", remote, schema.REMOTE)
    servers = remote["servers"]
    if not isinstance(servers, list) or not servers:
        raise ConfigError(
            "rollout.remote.servers", f"must be a non-empty list of URLs, got {servers!r}"
        )
    for url in servers:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError("rollout.remote.servers", f"{url!r} is not an http(s):// base URL")
    if len({u.rstrip("/") for u in servers}) != len(servers):
        raise ConfigError("rollout.remote.servers", f"lists a server twice: {servers}")
    if remote["weight_sync"] == "nccl" and world > 1:
        raise ConfigError(
            "rollout.remote.weight_sync",
            f"nccl supports one learner rank (the single NCCL sender), this run has {world}; "
            "use filesystem with several ranks",
        )
    # W > 1 learner ranks share the fleet: weight syncs are collective (frlab.rollout.remote.fleet_sync)
    # and each rank writes its snapshots under `<snapshot_dir>/rank<R>`.
