"""The plan: a run's resolved facts as a plain dict, printed by `dry_run=true` and recorded in
summary.json (`plan`), without loading anything.

Model, devices, batch sizes (global B, per rank, micro-batches per step, token budget and
packing), the rollout engine (with the number of servers of a fleet), the four objective
components each with its own hyperparameters, the trust region in words, the staleness bound,
the optimizer updates beside the lr schedule's own length (`optim.schedule_steps`: a paper
preset may stop before the reference run's schedule ends), the evaluation, the values that
differ from the declared defaults, and the output folder. (frlab.train adds the learner's
kernels, its memory line and the `auto` values chosen for its device.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from frlab.config import schema
from frlab.config.compose import locate
from frlab.config.declare import changed

NOT_RESOLVED = "(set by Hydra at run time)"


def plan_facts(
    cfg: DictConfig, sec: Mapping[str, Any], objective: Any, world: int, engine: str
) -> dict[str, Any]:
    """The facts of a validated run (`sec`: its resolved sections; `engine`: the option name).
    A config value is under its own key (`rollout.max_policy_lag`, `trainer.max_steps`,
    `objective.sequence_bernoulli_kl.delta`); a fact computed from several keys under a name
    of its own (`ranks`, `per_rank_batch_size`, `rollouts`, `trust`, ...)."""
    model, rollout, data, optim, trainer = (
        sec[k] for k in ("model", "rollout", "data", "optim", "trainer")
    )
    per_rank = data["batch_size"] // world
    facts = {
        "experiment": choice(cfg, "experiment"),
        "model.name_or_path": model["name_or_path"],
        "model": _describe_model(model),
        "model.tokenizer": str(model["tokenizer"]),
        "model.dtype": model["dtype"],
        "env._target_": str(cfg.env.get("_target_")),
        "rollout.engine": engine,
        "rollout.mode": rollout["mode"],
        "trainer.accelerator": trainer["accelerator"],
        "ranks": world,
        "trainer.strategy": _describe_strategy(trainer.get("strategy", "auto")),
        "trainer.precision": str(trainer["precision"]),
        "data.batch_size": data["batch_size"],
        "per_rank_batch_size": per_rank,
        "data.micro_batch_size": data["micro_batch_size"],
        "micro_batches_per_step": per_rank // data["micro_batch_size"],
        "data.max_tokens_per_micro_batch": data["max_tokens_per_micro_batch"],
        "data.pack_sequences": bool(data["pack_sequences"]),
        "optim.skip_zero_signal_steps": bool(optim["skip_zero_signal_steps"]),
        "rollout.samples_per_prompt": rollout["samples_per_prompt"],
        "rollout.max_in_flight": rollout["max_in_flight"],
        "rollout.max_policy_lag": rollout["max_policy_lag"],
        "rollout.sync_every": rollout["sync_every"],
        "rollout.max_turns": rollout["max_turns"],
        "rollout.max_len": rollout["max_len"],
        "rollout.sampling.max_new_tokens": rollout["sampling"]["max_new_tokens"],
        "rollout.sampling.temperature": float(rollout["sampling"]["temperature"]),
        "trainer.max_steps": trainer["max_steps"],
        "rollouts": trainer["max_steps"] * data["batch_size"],
        "optim.lr": float(optim["lr"]),
        "optim.scheduler": optim["scheduler"],
        "optim.schedule_steps": optim["schedule_steps"],
        "schedule_length": int(optim["schedule_steps"] or trainer["max_steps"]),
        "optim.warmup_ratio": float(optim["warmup_ratio"]),
        "optim.min_lr_ratio": float(optim["min_lr_ratio"]),
        "trust": objective.trust_region.describe(objective.names["trust_region"]),
        "servers": len(rollout["remote"]["servers"]) if rollout.get("remote") else None,
        "rollout.weight_update": rollout.get("weight_update"),
        "evaluation": _describe_eval(cfg.get("eval")),
        "memory": None,
        "learner": None,
        "model.gradient_checkpointing": model["gradient_checkpointing"],
        "logger._target_": None if cfg.get("logger") is None else str(cfg.logger.get("_target_")),
        "paths.output_dir": output_dir(cfg),
        "ckpt_path": cfg.get("ckpt_path"),
        "seed": int(cfg.seed),
        "changed": changed_settings(sec, _env_values(cfg)),
    }
    facts.update(objective_keys(objective))
    return facts


def objective_keys(objective: Any) -> dict[str, Any]:
    """`objective.<kind>`: each component's name; `objective.<name>.<field>`: its values."""
    out: dict[str, Any] = {f"objective.{kind}": name for kind, name in objective.names.items()}
    for name, values in objective.component_params().items():
        out.update({f"objective.{name}.{field}": value for field, value in values.items()})
    return out


def components(plan: Mapping[str, Any]) -> dict[str, str]:
    """{kind: name} of the plan's objective components."""
    from frlab.objective import KINDS

    return {kind: plan[f"objective.{kind}"] for kind in KINDS}


def component_params(plan: Mapping[str, Any], name: str) -> dict[str, Any]:
    prefix = f"objective.{name}."
    return {k.removeprefix(prefix): v for k, v in plan.items() if k.startswith(prefix)}


def plan_rows(plan: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, text) of each printed row."""
    lag = plan["rollout.max_policy_lag"]
    lag = f"<= {lag}" if plan["rollout.mode"] == "async" else "0 (sync: collect, then train)"
    zero = "skipped" if plan["optim.skip_zero_signal_steps"] else "step AdamW"
    return [
        ("experiment", plan["experiment"] or "-"),
        ("model", f"{plan['model']}  [{plan['model.dtype']}, tokenizer {plan['model.tokenizer']}]"),
        ("env", plan["env._target_"]),
        (
            "devices",
            f"{plan['ranks']} x {plan['trainer.accelerator']}, strategy "
            f"{plan['trainer.strategy']}, precision {plan['trainer.precision']}",
        ),
        (
            "batch",
            f"B={plan['data.batch_size']} (global), {plan['per_rank_batch_size']}/rank, "
            f"micro {plan['data.micro_batch_size']} x {plan['micro_batches_per_step']}/step, "
            f"G={plan['rollout.samples_per_prompt']}",
        ),
        ("micro", _micro_batching(plan)),
        (
            "rollout",
            f"{plan['rollout.mode']} on {_engine(plan)}, in flight "
            f"{plan['rollout.max_in_flight']}, sync every {plan['rollout.sync_every']}, "
            f"turns {plan['rollout.max_turns']}, max_len {plan['rollout.max_len']}, new "
            f"tokens {plan['rollout.sampling.max_new_tokens']}, "
            f"T={plan['rollout.sampling.temperature']:g}",
        ),
        (
            "weights",
            plan["rollout.weight_update"] or "the engine's default (in_flight where exact)",
        ),
        ("lag bound", lag),
        ("objective", _objective(plan)),
        ("trust", f"{plan['trust']}; token filter {_token_filter(plan)}"),
        (
            "updates",
            f"{plan['trainer.max_steps']} optimizer steps ({plan['rollouts']} rollouts); "
            f"zero-gradient batches {zero}",
        ),
        ("lr", _schedule(plan)),
        ("eval", plan["evaluation"]),
        *[(k, plan[k]) for k in ("learner", "memory") if plan.get(k)],
        ("logger", plan["logger._target_"] or "none (metrics.csv in the run folder)"),
        ("output dir", plan["paths.output_dir"]),
        ("resume", plan["ckpt_path"] or "no"),
        ("seed", str(plan["seed"])),
    ]


def format_plan(plan: Mapping[str, Any]) -> str:
    """The printed plan: one row per fact, then the values unlike their declared defaults."""
    rows = plan_rows(plan)
    width = max(len(k) for k, _ in rows)
    lines = [f"  {k:<{width}} : {v}" for k, v in rows]
    settings = [f"{k}={_yaml(v)}" for k, v in plan["changed"].items() if not isinstance(v, dict)]
    lines += wrapped(f"  {'changed':<{width}} : ", settings or ["(declared defaults)"])
    return "\n".join(["frlab plan", *lines])


def _objective(plan: Mapping[str, Any]) -> str:
    """`kind=name(p=v, ...)` per component, with the built components' values."""
    items = []
    for kind, name in components(plan).items():
        inner = ", ".join(f"{k}={_number(v)}" for k, v in component_params(plan, name).items())
        items.append(f"{kind}={name}" + (f"({inner})" if inner else ""))
    return " ".join(items)


def _token_filter(plan: Mapping[str, Any]) -> str:
    """`name p=v ...` with the built filter's hyperparameters (`none` has none)."""
    name = plan["objective.token_filter"]
    values = component_params(plan, name)
    return " ".join([name, *(f"{k}={_number(v)}" for k, v in sorted(values.items()))])


def _micro_batching(plan: Mapping[str, Any]) -> str:
    tokens = plan["data.max_tokens_per_micro_batch"]
    caps = f"<= {plan['data.micro_batch_size']} rows" + (f", <= {tokens} tokens" if tokens else "")
    layout = "packed (one padding-free row each)" if plan["data.pack_sequences"] else "padded rows"
    return f"{caps}; {layout}"


def _schedule(plan: Mapping[str, Any]) -> str:
    """`1e-06 cosine over N updates (warm-up 3%, floor 10%)[; the run stops at step M]`."""
    warmup, floor = plan["optim.warmup_ratio"], plan["optim.min_lr_ratio"]
    shape = [f"warm-up {warmup:.0%}"] if warmup else []
    if plan["optim.scheduler"] == "cosine":
        shape.append(f"floor {floor:.0%}")
    length, steps = plan["schedule_length"], plan["trainer.max_steps"]
    text = f"{plan['optim.lr']:g} {plan['optim.scheduler']} over {length} updates"
    text += f" ({', '.join(shape)})" if shape else ""
    if length != steps:
        text += f"; the run stops at step {steps}"
    return text


def _engine(plan: Mapping[str, Any]) -> str:
    servers, engine = plan["servers"], plan["rollout.engine"]
    if servers is None:
        return engine
    return f"{engine} ({servers} server{'s' if servers != 1 else ''})"


def _yaml(value: Any) -> str:
    """A value as written on the command line (null, true, 1e-06, [0.9, 0.95])."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def wrapped(head: str, items: list[str], width: int = 100) -> list[str]:
    """`head` + comma-separated items, continued on indented lines of at most `width`."""
    lines, line = [], head
    for i, item in enumerate(items):
        text = item + ("," if i < len(items) - 1 else "")
        if len(line) + len(text) > width and line.strip():
            lines.append(line.rstrip())
            line = " " * len(head)
        line += text + " "
    return [*lines, line.rstrip()]


def changed_settings(sec: Mapping[str, Any], env: Mapping[str, Any]) -> dict[str, Any]:
    """The keys whose values differ from their declared defaults: the declared sections', the
    chosen engine node's (against its declaration) and the env node's (against its class's
    constructor defaults)."""
    out: dict[str, Any] = {}
    for name, cls in schema.SECTIONS.items():
        out.update(changed(name, sec[name], cls))
    node = sec["rollout"].get("engine")
    found = schema.declaration_of(node.get("_target_")) if isinstance(node, Mapping) else None
    if found is not None:
        declaration = found[1]
        out.pop("rollout.engine", None)
        out.update(changed("rollout.engine", node, declaration))  # type: ignore[arg-type]
    return {**out, **_changed_env(env)}


def _changed_env(env: Mapping[str, Any]) -> dict[str, Any]:
    """`env.KEY` values unlike the env class's constructor defaults ({} when it cannot be read)."""
    import inspect

    try:
        params = inspect.signature(locate(str(env.get("_target_")))).parameters
    except (ImportError, ValueError, TypeError):
        return {}
    return {
        f"env.{k}": v
        for k, v in env.items()
        if not str(k).startswith("_") and (k not in params or params[k].default != v)
    }


def _env_values(cfg: DictConfig) -> dict[str, Any]:
    """The env node's values, resolved, without the keys that follow another key by
    interpolation (as for the sections); {} where they do not resolve (a dry run goes on)."""
    raw = cast(dict[str, Any], OmegaConf.to_container(cfg.env, resolve=False))
    try:
        values = cast(dict[str, Any], OmegaConf.to_container(cfg.env, resolve=True))
    except Exception:  # noqa: BLE001 - an interpolation only the run resolves
        return {}
    return {k: v for k, v in values.items() if not str(raw.get(k)).startswith("${")}


def _describe_eval(node: DictConfig | None) -> str:
    """The evaluation in one line (frlab.evaluation.checks.describe), or `none`."""
    from frlab.evaluation.checks import describe

    if node is None:
        return "none"
    return describe(cast(dict[str, Any], OmegaConf.to_container(node, resolve=True)))


def _number(value: Any) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def choice(cfg: DictConfig, group: str) -> str | None:
    """The option chosen for a config group (from the composed hydra node or the live run)."""
    from hydra.core.hydra_config import HydraConfig

    try:
        choices = cfg.hydra.runtime.choices if "hydra" in cfg else HydraConfig.get().runtime.choices
    except Exception:  # no hydra node and no live run, or a partial hydra config
        return None
    return choices.get(group)


def output_dir(cfg: DictConfig) -> str:
    """`paths.output_dir` if it can be resolved now, else a placeholder."""
    try:
        return str(cfg.paths.output_dir or NOT_RESOLVED)
    except Exception:
        return NOT_RESOLVED


def _describe_model(model: Mapping[str, Any]) -> str:
    if model["name_or_path"] is not None:
        return str(model["name_or_path"])
    c = model["config"]
    dims = ", ".join(
        f"{k.replace('num_hidden_', '').replace('_size', '')} {c[k]}"
        for k in ("hidden_size", "num_hidden_layers", "vocab_size")
        if k in c
    )
    return f"random-init {c['model_type']} ({dims})"


def _describe_strategy(strategy: Any) -> str:
    if isinstance(strategy, dict):
        return str(strategy.get("_target_", strategy)).rsplit(".", 1)[-1]
    return str(strategy)
