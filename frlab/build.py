"""The pieces `frlab.train.run` assembles a run from, each built from its config node.

Everything with a `_target_` goes through `frlab.config.instantiate.instantiate` (the
allowlist, with the run's `user_modules`): the policy (`model`), the rollout engine
(`rollout.engine`, a partial called once per rank with the policy and the rank's seed), the
data module (`data`), the evaluation (`eval`), the optimizer (`optim`, a partial), the
callbacks, the logger and the Trainer. Also here: the tokenizer, the env node's two factories
(fresh environments, one per episode: `env_factory`; task samplers, one per rollout pool:
`task_sampler_factory`), the per-rank rollout pool factory, the quieting of expected
warnings, the plots. The run folder and the resume checks are frlab.run.guard's.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from frlab.config.errors import ConfigError
from frlab.config.instantiate import instantiate, iter_targets

log = logging.getLogger(__name__)


def plain(node: Any) -> Any:
    """A resolved plain-container copy of a config node."""
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)
    return node


def arguments(node: Mapping[str, Any]) -> dict[str, Any]:
    """A section's keys without Hydra's `_target_` / `_partial_` (what the learner reads)."""
    return {k: v for k, v in node.items() if not str(k).startswith("_")}


def user_modules(cfg: DictConfig) -> tuple[str, ...]:
    return tuple(cfg.get("user_modules") or ())


def env_factory(node: DictConfig, *, user_modules: Iterable[str] = ()) -> Callable[[], Any]:
    """A zero-argument factory of fresh environments (one per episode) from an env node.

    Builds one environment right away so that a missing implementation or a bad kwarg fails
    before training starts, with a ConfigError naming `env._target_`. A flat node (one
    `_target_`, no Hydra flags) becomes a plain `functools.partial`, cheap and thread-safe.
    """
    modules = tuple(user_modules)
    first = instantiate(node, key="env", user_modules=modules)
    close = getattr(first, "close", None)
    if callable(close):
        close()
    kwargs = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
    kwargs = dict(kwargs)  # type: ignore[arg-type]
    flat = len(list(iter_targets(node, "env"))) == 1 and not any(
        k.startswith("_") and k != "_target_" for k in kwargs
    )
    if flat:
        from hydra.utils import get_object

        return functools.partial(get_object(kwargs.pop("_target_")), **kwargs)
    return functools.partial(instantiate, OmegaConf.create(kwargs), key="env", user_modules=modules)


def task_sampler_factory(node: Any, *, user_modules: Iterable[str] = ()) -> Callable[[], Any]:
    """A zero-argument factory of task samplers (envs.base.TaskSampler, one per rollout pool)
    from an env node: `env._target_`'s classmethod `task_sampler(**kwargs)`, which opens no
    episode. A target without one (a function that returns an env) samples from one instance
    it builds (`envs.base.EnvTaskSampler`)."""
    modules = tuple(user_modules)

    def make() -> Any:
        from envs.base import EnvTaskSampler

        built = instantiate(node, key="env", user_modules=modules, _partial_=True)
        target, args, kwargs = built.func, built.args, built.keywords
        try:
            if callable(getattr(target, "task_sampler", None)):
                return target.task_sampler(*args, **kwargs)
            return EnvTaskSampler(target(*args, **kwargs))
        except ConfigError:
            raise
        except (TypeError, ValueError, OSError) as exc:  # bad or missing env arguments
            raise ConfigError("env", f"cannot build its task sampler: {exc}") from exc

    return make


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


def load_tokenizer(model: Mapping[str, Any]) -> Any:
    """`model.tokenizer`, with a source that cannot be loaded reported at its key."""
    same = model["tokenizer"] == model.get("name_or_path")
    with model_source_errors(
        model["tokenizer"], "model.name_or_path" if same else "model.tokenizer"
    ):
        return build_tokenizer(model["tokenizer"])


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
    """The policy from the `model` node (its `_target_`, frlab.model.policy.build_policy by
    default); a source that cannot be loaded is a ConfigError naming `model.name_or_path`."""
    from frlab.config.schema import ModelConfig

    node = {"_target_": ModelConfig._target_, **model}
    with model_source_errors(model.get("name_or_path"), "model.name_or_path"):
        return instantiate(node, key="model", seed=seed)


@contextlib.contextmanager
def model_source_errors(source: Any, key: str) -> Iterator[None]:
    """Turn "not found / not loadable" errors of a model or tokenizer source into ConfigError."""
    try:
        yield
    except (OSError, ValueError) as exc:
        cause = _origin(exc)
        if source is None or isinstance(cause, ConfigError):
            raise
        if not isinstance(cause, OSError | ValueError):
            raise
        hint = (
            "a local folder, a Hugging Face id already in the local cache (offline: "
            "HF_HUB_OFFLINE=1), or a gguf: source"
        )
        raise ConfigError(
            key, f"cannot load {source!r}: {str(cause).splitlines()[0]} (expected {hint})"
        ) from exc


def _origin(exc: BaseException) -> BaseException:
    """The error under frlab's and Hydra's wrappers (ConfigError from `instantiate`)."""
    while (isinstance(exc, ConfigError) or type(exc).__name__ == "InstantiationException") and (
        exc.__cause__ is not None
    ):
        exc = exc.__cause__
    return exc


def pool_factory(
    cfg: DictConfig, policy: Any, tokenizer: Any, *, off_policy_correction: bool = True
) -> Callable[..., Any]:
    """A factory of RolloutPools, each with its own engine from `rollout.engine` and its own
    task sampler from the `env` node (the data module calls it per rank with `batch_size`,
    `seed`, `prompt_id_offset`, `prompt_id_stride`). `off_policy_correction` is the
    objective's: the pool refuses truncated sampling (top_p/top_k) when it is True."""
    from frlab.rollout.agent_loop import AgentLoopConfig
    from frlab.rollout.pool import RolloutPool

    rollout = plain(cfg.rollout)
    loop_cfg = AgentLoopConfig.from_rollout(rollout)  # limits, sampling, deadlines
    make_env = env_factory(cfg.env, user_modules=user_modules(cfg))  # one env per episode
    make_tasks = task_sampler_factory(cfg.env, user_modules=user_modules(cfg))  # one per pool
    make_engine = instantiate(cfg.rollout.engine, key="rollout.engine",
                              user_modules=user_modules(cfg))  # fmt: skip

    def make(*, batch_size: int, seed: int, **shard: Any) -> Any:
        """One rank's pool: `batch_size` = B / W rows per step, its own seed and prompt ids."""
        return RolloutPool(
            make_engine(policy=policy, seed=seed), make_env, tokenizer, loop_cfg,
            task_sampler=make_tasks(), batch_size=batch_size,
            max_in_flight=rollout["max_in_flight"], max_policy_lag=rollout["max_policy_lag"],
            mode=rollout["mode"],
            samples_per_prompt=rollout["samples_per_prompt"], seed=seed, **shard,
            off_policy_correction=off_policy_correction,
        )  # fmt: skip

    return make


def build_evaluation(cfg: DictConfig) -> Any:
    """The evaluation callback of the `eval` node (None when off, eval=none), built from its
    `_target_` (AvgAtKEvaluation or EpisodeEvaluation, frlab.config.evaluation)."""
    node = cfg.get("eval")
    if node is None:
        return None
    return instantiate(node, key="eval", user_modules=user_modules(cfg), env_factory=env_factory)


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
            node = OmegaConf.create(kwargs)
            callbacks.append(
                instantiate(node, key=f"callbacks.{name}", user_modules=user_modules(cfg))
            )
    return callbacks


def build_trainer(cfg: DictConfig, callbacks: list[Any], output_dir: Path) -> Any:
    """The Lightning Trainer of the `trainer` node: atomic checkpoint writes, the run folder
    as its root; `callbacks.model_checkpoint.enabled: false` also turns off Lightning's own
    default checkpointing."""
    from frlab.learner.checkpoint import AtomicCheckpointIO

    extra = {} if checkpoints_enabled(cfg) else {"enable_checkpointing": False}
    return instantiate(
        cfg.trainer, key="trainer", user_modules=user_modules(cfg), callbacks=callbacks,
        logger=build_logger(cfg), plugins=[AtomicCheckpointIO()],
        default_root_dir=str(output_dir), **extra,
    )  # fmt: skip


def build_logger(cfg: DictConfig) -> Any:
    """The `logger` node's logger, or False (no logger) when it is removed."""
    if cfg.get("logger") is None:
        return False
    return instantiate(cfg.logger, key="logger", user_modules=user_modules(cfg))


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


def write_plots(output_dir: Path) -> list[Path]:
    """PNG curves of this run into `<run>/plots` (failures are logged, never fatal)."""
    from frlab.plot import plot_runs

    try:
        return plot_runs([output_dir], output_dir / "plots")
    except Exception as exc:  # plotting must never lose a finished run
        log.warning("plots not written: %s", exc)
        return []
