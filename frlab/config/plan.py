"""`Plan`: the resolved facts of a run, printed by `dry_run=true` and recorded by the run.

Model, devices, batch sizes (global B, per rank, micro-batches per step, token budget and
packing), the rollout engine (with the number of servers of a `remote` fleet), the four objective
components each with the values of its own hyperparameters (whatever their names: a new
component's too), the trust region in words with its parameters and the token filter with its
own, the staleness (policy-lag)
bound, the number of optimizer updates (where the run stops) next to the lr schedule's own
length (`optim.schedule_steps`: a paper preset may stop at a headline step before the reference
run's schedule ends), the evaluation during training (`eval` group), the component names and
the output folder, without loading anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from omegaconf import DictConfig, OmegaConf

NOT_RESOLVED = "(set by Hydra at run time)"
LEARNER_SECTIONS = ("model", "data", "rollout", "trainer")  # what the learner's facts read


@dataclass
class Plan:
    """What a run will do; every field is a plain value (JSON-serialisable)."""

    experiment: str | None
    model: str
    tokenizer: str
    dtype: str
    env: str
    engine: str
    mode: str
    accelerator: str
    devices: int
    strategy: str
    precision: str
    batch_size: int
    per_rank_batch_size: int
    micro_batch_size: int
    micro_batches_per_step: int
    max_tokens_per_micro_batch: int | str | None  # `auto` until chosen
    pack_sequences: bool
    skip_zero_signal_steps: bool
    samples_per_prompt: int
    max_in_flight: int
    lag_bound: int
    sync_every: int
    max_turns: int
    max_len: int
    max_new_tokens: int
    temperature: float
    updates: int
    rollouts: int
    lr: float
    scheduler: str
    components: dict[str, str]
    schedule_steps: int = 0  # the lr schedule's length (optim.schedule_steps or `updates`)
    warmup_ratio: float = 0.0
    min_lr_ratio: float = 0.0
    component_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    delta: float | None = None
    trust: str = "-"
    q: float = 1.0  # the chosen token filter's own `q` (1.0 for a filter without one)
    servers: int | None = None  # rollout.engine=remote: size of the server fleet
    weight_update: str | None = None  # rollout.weight_update (None: the engine's default)
    evaluation: str = "none"  # the `eval` node in words (describe_eval)
    memory: str | None = None  # per-GPU memory (frlab.model.memory_plan; dry runs only)
    learner: str | None = None  # kernels and auto choices (frlab.model.learner_kernels)
    gradient_checkpointing: Any = None  # model.gradient_checkpointing as the run uses it
    logger: str | None = None
    output_dir: str = NOT_RESOLVED
    ckpt_path: str | None = None
    seed: int = 0
    changed: dict[str, Any] = field(default_factory=dict)  # values unlike the declared defaults
    # The composed objective, built once by preflight and handed to the learner (not recorded).
    objective: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """Every recorded field as plain values (JSON-serialisable)."""
        import copy

        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)
                if f.name != "objective"}  # fmt: skip

    def format(self) -> str:
        """A human-readable multi-line summary."""
        lag = f"<= {self.lag_bound}" if self.mode == "async" else "0 (sync: collect, then train)"
        rows = [
            ("experiment", self.experiment or "-"),
            ("model", f"{self.model}  [{self.dtype}, tokenizer {self.tokenizer}]"),
            ("env", self.env),
            ("devices", f"{self.devices} x {self.accelerator}, strategy {self.strategy}, "
                        f"precision {self.precision}"),
            ("batch", f"B={self.batch_size} (global), {self.per_rank_batch_size}/rank, "
                      f"micro {self.micro_batch_size} x {self.micro_batches_per_step}/step, "
                      f"G={self.samples_per_prompt}"),
            ("micro", self._micro_batching()),
            ("rollout", f"{self.mode} on {self._engine()}, in flight {self.max_in_flight}, "
                        f"sync every {self.sync_every}, turns {self.max_turns}, max_len "
                        f"{self.max_len}, new tokens {self.max_new_tokens}, T={self.temperature:g}"),
            ("weights", self.weight_update or "the engine's default (in_flight where exact)"),
            ("lag bound", lag),
            ("objective", self._objective()),
            ("trust", f"{self.trust}; token filter {self._token_filter()}"),
            ("updates", f"{self.updates} optimizer steps ({self.rollouts} rollouts); "
                        f"zero-gradient batches "
                        f"{'skipped' if self.skip_zero_signal_steps else 'step AdamW'}"),
            ("lr", self._schedule()),
            ("eval", self.evaluation),
            *([("learner", self.learner)] if self.learner else []),
            *([("memory", self.memory)] if self.memory else []),
            ("logger", self.logger or "none (metrics.csv in the run folder)"),
            ("output dir", self.output_dir),
            ("resume", self.ckpt_path or "no"),
            ("seed", str(self.seed)),
        ]  # fmt: skip
        width = max(len(k) for k, _ in rows)
        lines = [f"  {k:<{width}} : {v}" for k, v in rows]
        settings = [f"{k}={_yaml(v)}" for k, v in self.changed.items() if not isinstance(v, dict)]
        lines += wrapped(f"  {'changed':<{width}} : ", settings or ["(declared defaults)"])
        return "\n".join(["frlab plan", *lines])

    def _objective(self) -> str:
        """`kind=name(p=v, ...)` per component, with the built components' values (defaults
        included; a component without hyperparameters shows its name only)."""
        items = []
        for kind, name in self.components.items():
            values = self.component_params.get(name, {})
            inner = ", ".join(f"{k}={_number(v)}" for k, v in values.items())
            items.append(f"{kind}={name}" + (f"({inner})" if inner else ""))
        return " ".join(items)

    def _token_filter(self) -> str:
        """`name p=v ...` with the built filter's hyperparameters (`none` has none)."""
        name = self.components["token_filter"]
        values = self.component_params.get(name, {})
        return " ".join([name, *(f"{k}={_number(v)}" for k, v in sorted(values.items()))])

    def _micro_batching(self) -> str:
        tokens = self.max_tokens_per_micro_batch
        caps = f"<= {self.micro_batch_size} rows" + (f", <= {tokens} tokens" if tokens else "")
        layout = "packed (one padding-free row each)" if self.pack_sequences else "padded rows"
        return f"{caps}; {layout}"

    def _schedule(self) -> str:
        """`1e-06 cosine over N updates (warm-up 3%, floor 10%)[, run stops at step M]`."""
        shape = [f"warm-up {self.warmup_ratio:.0%}"] if self.warmup_ratio else []
        if self.scheduler == "cosine":
            shape.append(f"floor {self.min_lr_ratio:.0%}")
        text = f"{self.lr:g} {self.scheduler} over {self.schedule_steps} updates"
        text += f" ({', '.join(shape)})" if shape else ""
        if self.schedule_steps != self.updates:
            text += f"; the run stops at step {self.updates}"
        return text

    def _engine(self) -> str:
        if self.servers is None:
            return self.engine
        return f"{self.engine} ({self.servers} server{'s' if self.servers != 1 else ''})"


def _yaml(value: Any) -> str:
    """A value as written on the command line (null, true, 1e-06, [0.9, 0.95])."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


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


def changed_settings(
    sec: Mapping[str, Any], trainer: Mapping[str, Any], env: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The keys whose values differ from their declared defaults: the declared sections', the
    chosen engine node's (against its declaration) and the env node's (against its class's
    constructor defaults)."""
    from frlab.config import schema
    from frlab.config.declare import changed
    from frlab.config.engines import ENGINES, engine_name

    values = {**sec, "trainer": trainer}
    out: dict[str, Any] = {}
    for name, cls in schema.SECTIONS.items():
        out.update(changed(name, values[name], cls))
    node = sec["rollout"].get("engine")
    declaration = ENGINES.get(engine_name(node)) if isinstance(node, Mapping) else None
    if declaration is not None:
        out.pop("rollout.engine", None)
        out.update(changed("rollout.engine", node, declaration))
    return {**out, **_changed_env(env or {})}


def _changed_env(env: Mapping[str, Any]) -> dict[str, Any]:
    """`env.KEY` values unlike the env class's constructor defaults ({} when it cannot be read)."""
    import inspect

    from frlab.config.instantiate import locate

    try:
        params = inspect.signature(locate(str(env.get("_target_")))).parameters
    except (ImportError, ValueError, TypeError):
        return {}
    return {f"env.{k}": v for k, v in env.items()
            if not str(k).startswith("_") and (k not in params or params[k].default != v)}  # fmt: skip


def build_plan(
    cfg: DictConfig,
    sec: dict[str, dict[str, Any]],
    trainer: dict[str, Any],
    objective: Any,
    world: int,
    engine: str,
) -> Plan:
    """Assemble the Plan from the validated, resolved sections (`engine`: its name)."""
    model, rollout, data = sec["model"], sec["rollout"], sec["data"]
    names = dict(objective.names)
    params = objective.component_params()  # the built components' values, defaults included
    delta = params.get(names["trust_region"], {}).get("delta")
    token_filter = params.get(names["token_filter"], {})  # the built filter's own values
    q = token_filter.get("q", 1.0)
    per_rank = data["batch_size"] // world
    return Plan(
        experiment=choice(cfg, "experiment"),
        model=_describe_model(model),
        tokenizer=str(model["tokenizer"]),
        dtype=model["dtype"],
        env=str(cfg.env.get("_target_")),
        engine=engine,
        mode=rollout["mode"],
        accelerator=trainer["accelerator"],
        devices=world,
        strategy=_describe_strategy(trainer.get("strategy", "auto")),
        precision=str(trainer["precision"]),
        batch_size=data["batch_size"],
        per_rank_batch_size=per_rank,
        micro_batch_size=data["micro_batch_size"],
        micro_batches_per_step=per_rank // data["micro_batch_size"],
        max_tokens_per_micro_batch=data.get("max_tokens_per_micro_batch"),
        gradient_checkpointing=model.get("gradient_checkpointing"),
        pack_sequences=bool(data.get("pack_sequences", True)),
        skip_zero_signal_steps=bool(sec["optim"].get("skip_zero_signal_steps", False)),
        samples_per_prompt=rollout["samples_per_prompt"],
        max_in_flight=rollout["max_in_flight"],
        lag_bound=rollout["max_policy_lag"],
        sync_every=rollout["sync_every"],
        max_turns=rollout["max_turns"],
        max_len=rollout["max_len"],
        max_new_tokens=rollout["sampling"]["max_new_tokens"],
        temperature=float(rollout["sampling"]["temperature"]),
        updates=trainer["max_steps"],
        rollouts=trainer["max_steps"] * data["batch_size"],
        lr=float(sec["optim"]["lr"]),
        scheduler=sec["optim"]["scheduler"],
        schedule_steps=int(sec["optim"].get("schedule_steps") or trainer["max_steps"]),
        warmup_ratio=float(sec["optim"]["warmup_ratio"]),
        min_lr_ratio=float(sec["optim"]["min_lr_ratio"]),
        components=names,
        component_params=params,
        delta=None if delta is None or not objective.uses_off_policy_correction else float(delta),
        trust=describe_trust_region(names["trust_region"], objective.trust_region),
        q=float(q),
        servers=len(rollout["remote"]["servers"]) if rollout.get("remote") else None,  # a fleet
        weight_update=rollout.get("weight_update"),
        evaluation=describe_eval(cfg.get("eval")),
        logger=None if cfg.get("logger") is None else str(cfg.logger.get("_target_")),
        output_dir=output_dir(cfg),
        ckpt_path=cfg.get("ckpt_path"),
        seed=int(cfg.seed),
        changed=changed_settings(sec, trainer, _env_values(cfg)),
        objective=objective,
    )


def _env_values(cfg: DictConfig) -> dict[str, Any]:
    """The env node's values, resolved, without the keys that follow another key by
    interpolation (as for the sections); {} where they do not resolve (a dry run goes on)."""
    raw: dict[str, Any] = OmegaConf.to_container(cfg.env, resolve=False)  # type: ignore[assignment]
    try:
        values: dict[str, Any] = OmegaConf.to_container(cfg.env, resolve=True)  # type: ignore[assignment]
    except Exception:  # noqa: BLE001 - an interpolation only the run resolves
        return {}
    return {k: v for k, v in values.items() if not str(raw.get(k)).startswith("${")}


def describe_trust_region(name: str, trust_region: Any) -> str:
    """`name p=v ...` with the built component's hyperparameters and their values; for one
    without any, `name: ` and its maths in one line (the class docstring's, as the README's
    component table shows it)."""
    values = [f"{p}={_number(v)}" for p, v in trust_region.params().items()]
    if not values:
        return f"{name}: {trust_region.summary().rstrip('.')}"
    return " ".join([name, *values])


def describe_eval(node: DictConfig | None) -> str:
    """`KIND avg@K every N steps[ and at step 0] on A, B (T=t, top_p=p[, first L each])`, or
    `none` (eval=none).

    Expects a node that passed `frlab.config.evaluation.check_eval` (it resolves cleanly)."""
    if node is None:
        return "none"
    ev: dict[str, Any] = OmegaConf.to_container(node, resolve=True)  # type: ignore[assignment]
    sampling = ev["sampling"]
    details = [f"T={float(sampling['temperature']):g}", f"top_p={float(sampling['top_p']):g}"]
    if ev.get("limit") is not None:
        details.append(f"first {ev['limit']} each")
    from frlab.evaluation.benchmarks import benchmark_specs

    names = ", ".join(str(name) for name in benchmark_specs(ev["benchmarks"]))
    start = " and at step 0" if ev.get("at_start") else ""
    return (
        f"{ev['kind']} avg@{ev['k']} every {ev['every_n_steps']} steps{start} on {names} "
        f"({', '.join(details)})"
    )


def _number(value: Any) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def choice(cfg: DictConfig, group: str) -> str | None:
    """The option chosen for a config group (from the composed hydra node or the live run)."""
    from hydra.core.hydra_config import HydraConfig

    try:
        if "hydra" in cfg:
            return cfg.hydra.runtime.choices.get(group)
        if HydraConfig.initialized():
            return HydraConfig.get().runtime.choices.get(group)
    except Exception:  # compose without hydra node or a partial hydra config
        return None
    return None


def output_dir(cfg: DictConfig) -> str:
    """`paths.output_dir` if it can be resolved now, else a placeholder."""
    try:
        value = cfg.paths.output_dir
    except Exception:
        return NOT_RESOLVED
    return str(value) if value else NOT_RESOLVED


def _describe_model(model: dict[str, Any]) -> str:
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


def learner_plan(cfg: DictConfig, plan: Plan, config: Any = None) -> None:
    """The plan's learner facts (frlab.model.learner_kernels): its kernels, its memory line,
    and `auto` budget and checkpointing chosen for the learner's device here (`config`: the
    model's transformers config, once loaded)."""
    from frlab.config.engines import engine_class
    from frlab.model.auto_memory import device_memory
    from frlab.model.learner_kernels import learner_facts

    sections = {k: OmegaConf.to_container(cfg[k], resolve=True) for k in LEARNER_SECTIONS}
    engine = engine_class(sections["rollout"])  # type: ignore[arg-type]
    facts = learner_facts(
        sections, getattr(engine, "reserves_gpu_share", False),
        device_memory(sections["trainer"]["accelerator"]), config,
    )  # fmt: skip
    for name, value in facts.items():
        setattr(plan, name, value)
