"""`Plan`: the resolved facts of a run, printed by `dry_run=true` and recorded by the run.

Model, devices, batch sizes (global B, per rank, micro-batches per step), the rollout engine
(with the number of servers of a `remote` fleet), the trust region with its own parameters
(delta, cap, clip range, ratio bounds) and the entropy-filter q, the staleness (policy-lag)
bound, the number of optimizer updates, the evaluation during training (`eval` group), the
component names and the output folder, without loading anything.
"""

from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

NOT_RESOLVED = "(set by Hydra at run time)"


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
    component_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    delta: float | None = None
    trust: str = "-"
    q: float = 1.0
    servers: int | None = None  # rollout.engine=remote: size of the server fleet
    evaluation: str = "none"  # the `eval` node in words (describe_eval)
    logger: str | None = None
    output_dir: str = NOT_RESOLVED
    ckpt_path: str | None = None
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def format(self) -> str:
        """A human-readable multi-line summary."""
        c = self.components
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
            ("rollout", f"{self.mode} on {self._engine()}, in flight {self.max_in_flight}, "
                        f"sync every {self.sync_every}, turns {self.max_turns}, max_len "
                        f"{self.max_len}, new tokens {self.max_new_tokens}, T={self.temperature:g}"),
            ("lag bound", lag),
            ("objective", f"baseline={c['baseline']} trust_region={c['trust_region']} "
                          f"aggregation={c['aggregation']} token_filter={c['token_filter']}"),
            ("trust", f"{self.trust}; token filter q={self.q:g}"),
            ("updates", f"{self.updates} optimizer steps ({self.rollouts} rollouts), lr "
                        f"{self.lr:g} {self.scheduler}"),
            ("eval", self.evaluation),
            ("logger", self.logger or "none"),
            ("output dir", self.output_dir),
            ("resume", self.ckpt_path or "no"),
            ("seed", str(self.seed)),
        ]  # fmt: skip
        width = max(len(k) for k, _ in rows)
        return "\n".join(["frlab plan"] + [f"  {k:<{width}} : {v}" for k, v in rows])

    def _engine(self) -> str:
        if self.servers is None:
            return self.engine
        return f"{self.engine} ({self.servers} server{'s' if self.servers != 1 else ''})"


def build_plan(
    cfg: DictConfig,
    sec: dict[str, dict[str, Any]],
    trainer: dict[str, Any],
    objective: Any,
    world: int,
) -> Plan:
    """Assemble the Plan from the validated, resolved sections."""
    model, rollout, data, obj = sec["model"], sec["rollout"], sec["data"], sec["objective"]
    names = dict(objective.names)
    params = {n: dict(obj.get(n) or {}) for n in names.values() if isinstance(obj.get(n), dict)}
    delta = params.get(names["trust_region"], {}).get("delta")
    q = params.get("entropy_failures", {}).get("q", 1.0) if names["token_filter"] != "none" else 1.0
    per_rank = data["batch_size"] // world
    return Plan(
        experiment=choice(cfg, "experiment"),
        model=_describe_model(model),
        tokenizer=str(model["tokenizer"]),
        dtype=model["dtype"],
        env=str(cfg.env.get("_target_")),
        engine=rollout["engine"],
        mode=rollout["mode"],
        accelerator=trainer["accelerator"],
        devices=world,
        strategy=_describe_strategy(trainer.get("strategy", "auto")),
        precision=str(trainer["precision"]),
        batch_size=data["batch_size"],
        per_rank_batch_size=per_rank,
        micro_batch_size=data["micro_batch_size"],
        micro_batches_per_step=per_rank // data["micro_batch_size"],
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
        components=names,
        component_params=params,
        delta=None if delta is None or not objective.uses_off_policy_correction else float(delta),
        trust=describe_trust_region(names["trust_region"], objective.trust_region),
        q=float(q),
        servers=len(rollout["remote"]["servers"]) if rollout["engine"] == "remote" else None,
        evaluation=describe_eval(cfg.get("eval")),
        logger=None if cfg.get("logger") is None else str(cfg.logger.get("_target_")),
        output_dir=output_dir(cfg),
        ckpt_path=cfg.get("ckpt_path"),
        seed=int(cfg.seed),
    )


# Trust regions with no parameter of their own: what they do to the off-policy ratio.
NO_GATE = {"none": "plain token IS, no gate", "no_is": "no IS, no gate"}


def describe_trust_region(name: str, trust_region: Any) -> str:
    """`name p=v ...` with the built component's own parameters (its constructor's arguments)."""
    if name in NO_GATE:
        return NO_GATE[name]
    params = inspect.signature(type(trust_region)).parameters
    values = [
        f"{p}={_number(getattr(trust_region, p))}" for p in params if hasattr(trust_region, p)
    ]
    return " ".join([name, *values])


def describe_eval(node: DictConfig | None) -> str:
    """`KIND avg@K every N steps on A, B (T=t, top_p=p[, first L each])`, or `none` (eval=none).

    Expects a node that passed `frlab.config.eval_check.check_eval` (it resolves cleanly)."""
    if node is None:
        return "none"
    ev: dict[str, Any] = OmegaConf.to_container(node, resolve=True)  # type: ignore[assignment]
    sampling = ev["sampling"]
    details = [f"T={float(sampling['temperature']):g}", f"top_p={float(sampling['top_p']):g}"]
    if ev.get("limit") is not None:
        details.append(f"first {ev['limit']} each")
    from frlab.tracking.benchmarks import benchmark_specs

    names = ", ".join(str(name) for name in benchmark_specs(ev["benchmarks"]))
    start = "at step 0 and " if ev.get("at_start") else ""
    return (
        f"{ev['kind']} avg@{ev['k']} {start}every {ev['every_n_steps']} steps on {names} "
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
