"""`run(cfg) -> summary`: wire a validated config into a FlashREINFORCE training run.

Order (FlashREINFORCE paper; SPEC §3): preflight, seed, tokenizer, policy, the learner module
(policy + composed objective), the rollout side (engine with its OWN copy of the weights, one
environment per episode, the asynchronous pool behind a DataModule), callbacks (weight sync
every `rollout.sync_every` steps, avg@k evaluation from the `eval` group, run files,
progress bar, atomic checkpoints), the logger and the Lightning Trainer; then `fit`
(resuming from `ckpt_path`), plots into the run folder, and the summary dict (also in
`summary.json`). Every object built from a `_target_` goes through
`frlab.config.instantiate.instantiate` (the allowlist).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from frlab.config.errors import ConfigError
from frlab.config.instantiate import instantiate, iter_targets
from frlab.config.plan import NOT_RESOLVED, Plan

log = logging.getLogger(__name__)


def plain(node: Any) -> Any:
    """A resolved plain-container copy of a config node."""
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)
    return node


def build_tokenizer(name: str) -> Any:
    """The tokenizer: `toy` -> the local toy tokenizer, else AutoTokenizer (hub id, folder or
    `gguf:` source, frlab.model.gguf)."""
    if name == "toy":
        from frlab.model.toy_tokenizer import build_toy_tokenizer

        return build_toy_tokenizer()
    from transformers import AutoTokenizer

    from frlab.model.gguf import resolve_model_source

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_source(name))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def check_vocab(model: Mapping[str, Any], tokenizer: Any) -> None:
    """A random-init model must embed every token id the tokenizer can produce."""
    config = model.get("config") or {}
    vocab = config.get("vocab_size")
    if model.get("name_or_path") is None and isinstance(vocab, int) and len(tokenizer) > vocab:
        raise ConfigError(
            "model.config.vocab_size",
            f"({vocab}) is smaller than the tokenizer's vocabulary ({len(tokenizer)})",
        )


def build_policy_from(model: Mapping[str, Any], seed: int) -> Any:
    """The policy from the `model` node; a path or id that cannot be loaded is a ConfigError
    naming `model.name_or_path` (not a transformers traceback)."""
    from frlab.model import build_policy

    kwargs = {
        k: model[k]
        for k in ("name_or_path", "config", "dtype", "gradient_checkpointing",
                  "trust_remote_code", "attn_implementation")
        if k in model
    }  # fmt: skip
    with _model_source_errors(model.get("name_or_path"), "model.name_or_path"):
        return build_policy(**kwargs, seed=seed)


@contextlib.contextmanager
def _model_source_errors(source: Any, key: str) -> Iterator[None]:
    """Turn "not found / not loadable" errors of a model or tokenizer source into ConfigError."""
    try:
        yield
    except (OSError, ValueError) as exc:
        if source is None or isinstance(exc, ConfigError):
            raise
        hint = (
            "a local folder, a Hugging Face id already in the local cache (offline: "
            "HF_HUB_OFFLINE=1), or a gguf: source"
        )
        raise ConfigError(
            key, f"cannot load {source!r}: {str(exc).splitlines()[0]} (expected {hint})"
        ) from exc


def check_resume(ckpt_path: Any, cfg: DictConfig, output_dir: Path) -> None:
    """`ckpt_path=last` needs `last.ckpt` in this run folder's checkpoint dir (the default
    run folder has a timestamp: pass `hydra.run.dir=<the old run folder>`); an explicit path
    must exist. Lightning would only warn and silently start from scratch."""
    if ckpt_path is None:
        return
    if str(ckpt_path) == "last":
        node = (cfg.get("callbacks") or {}).get("model_checkpoint") or {}
        last = Path(str(node.get("dirpath") or output_dir / "checkpoints")) / "last.ckpt"
        if not os.path.lexists(last):
            raise ConfigError(
                "ckpt_path",
                f"=last but {last} does not exist: nothing to resume. Point hydra.run.dir at "
                "the run folder to resume (the default folder name has a new timestamp), or "
                "pass ckpt_path=<path to a .ckpt>",
            )
        return
    if not os.path.exists(str(ckpt_path)):
        raise ConfigError("ckpt_path", f"checkpoint {ckpt_path} does not exist")


def env_factory(node: DictConfig) -> Callable[[], Any]:
    """A zero-argument factory of fresh environments (one per episode) from the env node.

    Builds one environment right away so that a missing implementation or a bad kwarg fails
    before training starts, with a ConfigError naming `env._target_`. A flat node (one
    `_target_`, no Hydra flags) becomes a plain `functools.partial`, cheap and thread-safe.
    """
    first = instantiate(node, key="env")
    close = getattr(first, "close", None)
    if callable(close):
        close()
    kwargs = plain(node)
    flat = len(list(iter_targets(node, "env"))) == 1 and not any(
        k.startswith("_") and k != "_target_" for k in kwargs
    )
    if flat:
        from hydra.utils import get_object

        return functools.partial(get_object(kwargs.pop("_target_")), **kwargs)
    return functools.partial(instantiate, OmegaConf.create(kwargs), key="env")


def build_engine_for(
    rollout: Mapping[str, Any], model: Mapping[str, Any], policy: Any, seed: int
) -> Any:
    """The rollout engine (its own copy of the weights; started and stopped by the pool)."""
    from frlab.model.gguf import resolve_model_source
    from frlab.rollout.engine import build_engine

    if rollout["engine"] == "torch":
        return build_engine(
            "torch", model=policy, device=rollout["device"], seed=seed,
            max_batch_size=rollout["max_in_flight"],
            record_routing=bool(model.get("routing_replay", False)),
        )  # fmt: skip
    if rollout["engine"] == "remote":
        return build_engine(
            "remote", seed=seed, initial_weights=policy.state_dict(), **rollout["remote"]
        )
    extra = dict(rollout.get("vllm_engine_args") or {})  # e.g. gpu_memory_utilization
    return build_engine(
        "vllm", model=resolve_model_source(model["name_or_path"]), seed=seed,
        max_model_len=rollout["max_len"], **extra,
    )  # fmt: skip


def pool_factory(
    cfg: DictConfig, policy: Any, tokenizer: Any, *, off_policy_correction: bool = True
) -> Callable[..., Any]:
    """A factory of RolloutPools, each with its own engine (RolloutDataModule calls it per rank
    with `batch_size`, `seed`, `prompt_id_offset`, `prompt_id_stride`). `off_policy_correction`
    is the objective's: the pool refuses truncated sampling (top_p/top_k) when it is True."""
    from frlab.rollout.agent_loop import AgentLoopConfig
    from frlab.rollout.engine import SamplingParams
    from frlab.rollout.pool import RolloutPool

    rollout, model = plain(cfg.rollout), plain(cfg.model)
    sampling = SamplingParams.from_mapping(rollout["sampling"])
    loop_cfg = AgentLoopConfig(max_turns=rollout["max_turns"], max_len=rollout["max_len"],
                               sampling=sampling)  # fmt: skip
    make_env = env_factory(cfg.env)

    def make(*, batch_size: int, seed: int, **shard: Any) -> Any:
        """One rank's pool: `batch_size` = B / W rows per step, its own seed and prompt ids."""
        engine = build_engine_for(rollout, model, policy, seed)
        return RolloutPool(
            engine, make_env, tokenizer, loop_cfg,
            batch_size=batch_size, max_in_flight=rollout["max_in_flight"],
            max_policy_lag=rollout["max_policy_lag"], mode=rollout["mode"],
            samples_per_prompt=rollout["samples_per_prompt"], seed=seed, **shard,
            off_policy_correction=off_policy_correction,
        )  # fmt: skip

    return make


def training_questions(make_env: Callable[[], Any]) -> Callable[[], set[str]]:
    """A callable giving the training env's questions (empty when its tasks are not a
    dataset), to count evaluation problems that training also sees."""

    def questions() -> set[str]:
        dataset = getattr(make_env(), "dataset", None) or ()
        return {str(task.get("question", "")).strip() for task in dataset}

    return questions


def build_evaluation(cfg: DictConfig) -> Any:
    """The evaluation callback of the `eval` node (None when off, eval=none): kind `math` ->
    AvgAtKEvaluation; `episodes` -> EpisodeEvaluation, one env factory per benchmark (the
    training env node with the benchmark's keys changed)."""
    from frlab.tracking.benchmarks import benchmark_specs

    node = cfg.get("eval")
    if node is None:
        return None
    spec = plain(node)
    kind, sampling, benchmarks = spec.pop("kind"), spec.pop("sampling"), spec.pop("benchmarks")
    benchmarks = benchmark_specs(benchmarks)
    if kind == "math":
        from frlab.tracking.evaluation import AvgAtKEvaluation

        env = plain(cfg.env)
        questions = training_questions(env_factory(cfg.env)) if "source" in env else None
        return AvgAtKEvaluation(benchmarks, **spec, **sampling, training_questions=questions)
    from frlab.tracking.episode_evaluation import EpisodeEvaluation

    factories = {
        name: env_factory(OmegaConf.merge(plain(cfg.env), changes or {}))
        for name, changes in benchmarks.items()
    }
    return EpisodeEvaluation(
        factories, **spec, **sampling,
        max_turns=int(cfg.rollout.max_turns), max_len=int(cfg.rollout.max_len),
    )  # fmt: skip


def callback_enabled(node: Any) -> bool:
    """Whether a `callbacks.NAME` entry is on: not null and not `enabled: false`."""
    return node is not None and node.get("enabled", True) is not False


def checkpoints_enabled(cfg: DictConfig) -> bool:
    """Whether the run writes checkpoints (`callbacks.model_checkpoint.enabled`, default on)."""
    return callback_enabled((cfg.get("callbacks") or {}).get("model_checkpoint"))


def build_callbacks(cfg: DictConfig, run_files: Any) -> list[Any]:
    """Weight sync, avg@k evaluation (if configured), run files, then the `callbacks` group
    (entries that are null or have `enabled: false` are skipped).

    Evaluation comes after the weight sync (it measures the step's new weights) and before
    the run files, so its values land in the same step's metrics.csv row."""
    from frlab.rollout.callbacks import WeightSyncCallback

    evaluation = build_evaluation(cfg)
    callbacks = [WeightSyncCallback(sync_every=int(cfg.rollout.sync_every))]
    callbacks += [evaluation] if evaluation is not None else []
    callbacks.append(run_files)
    for name, node in (cfg.get("callbacks") or {}).items():
        if callback_enabled(node):
            kwargs = {k: v for k, v in plain(node).items() if k != "enabled"}
            callbacks.append(instantiate(OmegaConf.create(kwargs), key=f"callbacks.{name}"))
    return callbacks


def build_trainer(cfg: DictConfig, callbacks: list[Any], output_dir: Path) -> Any:
    """The Lightning Trainer; `callbacks.model_checkpoint.enabled: false` also turns off
    Lightning's own default checkpointing."""
    from frlab.learner.checkpoint import AtomicCheckpointIO

    logger = instantiate(cfg.logger, key="logger") if cfg.get("logger") is not None else False
    extra = {} if checkpoints_enabled(cfg) else {"enable_checkpointing": False}
    return instantiate(
        cfg.trainer, key="trainer", callbacks=callbacks, logger=logger,
        plugins=[AtomicCheckpointIO()], default_root_dir=str(output_dir), **extra,
    )  # fmt: skip


def resolve_output_dir(cfg: DictConfig, plan: Plan) -> Path:
    if plan.output_dir != NOT_RESOLVED:
        return Path(plan.output_dir)
    raise ConfigError("paths.output_dir", "cannot be resolved outside a Hydra run: set it")


# Warnings that frlab's setup triggers by design and that tell the user nothing.
EXPECTED_WARNINGS = (
    r".*LeafSpec",  # lightning 2.6 with torch 2.13
    r"Your `IterableDataset` has `__len__` defined",  # whole batches, in-process, by design
    r"You have overridden `transfer_batch_to_device`",  # the module moves RolloutBatch itself
    r"Using ModelCheckpoint with manual optimization",  # checkpoints follow the step: intended
    r"torch.distributed.nn.functional.all_gather is deprecated",  # inside Lightning's all_gather
)


def quiet_expected_noise() -> None:
    """Filter EXPECTED_WARNINGS and per-request HTTP logs; print Lightning's log lines once when
    Hydra configured logging.

    `import lightning` attaches its own console handler to the `lightning` logger, which also
    propagates to the root logger that Hydra set up (console + run-folder log file).
    """
    for pattern in EXPECTED_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    # httpx (the remote rollout backend) logs every request at INFO; failures are logged by
    # frlab.rollout.remote.engine instead.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if logging.getLogger().handlers:
        lightning_log = logging.getLogger("lightning")
        for handler in list(lightning_log.handlers):
            if type(handler) is logging.StreamHandler:
                lightning_log.removeHandler(handler)


def run(cfg: DictConfig, plan: Plan | None = None) -> dict[str, Any]:
    """Train as configured; return the run summary (also written to summary.json)."""
    from frlab.config.preflight import preflight

    plan = plan or preflight(cfg)
    import lightning as L

    from frlab.data.datamodule import RolloutDataModule
    from frlab.learner import FlashReinforceModule
    from frlab.tracking import RunFilesCallback

    quiet_expected_noise()
    output_dir = resolve_output_dir(cfg, plan)
    check_resume(cfg.get("ckpt_path"), cfg, output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    L.seed_everything(int(cfg.seed), workers=True)
    model = plain(cfg.model)
    same = model["tokenizer"] == model.get("name_or_path")
    with _model_source_errors(
        model["tokenizer"], "model.name_or_path" if same else "model.tokenizer"
    ):
        tokenizer = build_tokenizer(model["tokenizer"])
    check_vocab(model, tokenizer)
    policy = build_policy_from(model, int(cfg.seed))
    module = FlashReinforceModule(
        model, plain(cfg.objective), plain(cfg.optim),
        batch_size=plan.batch_size, micro_batch_size=plan.micro_batch_size,
        temperature=plan.temperature, max_steps=plan.updates, policy=policy,
    )  # fmt: skip
    datamodule = RolloutDataModule(
        pool_factory(cfg, policy, tokenizer,
                     off_policy_correction=module.objective.uses_off_policy_correction),
        batch_size=plan.batch_size, seed=int(cfg.seed),
        pad_token_id=int(tokenizer.pad_token_id),
    )  # fmt: skip
    run_files = RunFilesCallback(
        output_dir, components=plan.components, extra={"plan": plan.to_dict()}
    )
    trainer = build_trainer(cfg, build_callbacks(cfg, run_files), output_dir)
    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    summary = run_files.summary or run_files.finish("finished")
    if cfg.get("plots", True) and trainer.is_global_zero and run_files.rows:
        summary["plots"] = [str(p) for p in write_plots(output_dir)]
    return summary


def write_plots(output_dir: Path) -> list[Path]:
    """PNG curves of this run into `<run>/plots` (failures are logged, never fatal)."""
    from frlab.plot import plot_runs

    try:
        return plot_runs([output_dir], output_dir / "plots")
    except Exception as exc:  # plotting must never lose a finished run
        log.warning("plots not written: %s", exc)
        return []
