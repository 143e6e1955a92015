"""The Lightning side of a run, each built from its config node
(`frlab.config.compose.instantiate`):
the callbacks (weight sync, evaluation, run files, the `callbacks` group), the logger and the
Trainer; and the quieting of the warnings frlab's setup triggers by design."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from frlab.config.compose import instantiate


def plain(node: Any) -> Any:
    """A resolved plain-container copy of a config node."""
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)
    return node


def arguments(node: Mapping[str, Any]) -> dict[str, Any]:
    """A section's keys without Hydra's `_target_` / `_partial_` (what the learner reads)."""
    return {k: v for k, v in node.items() if not str(k).startswith("_")}


def build_evaluation(cfg: DictConfig) -> Any:
    """The evaluation callback of the `eval` node (None when off, eval=none), built from its
    `_target_` (AvgAtKEvaluation or EpisodeEvaluation) with the run's env factory."""
    from frlab.rollout.pool.factory import env_factory

    node = cfg.get("eval")
    if node is None:
        return None
    return instantiate(node, key="eval", env_factory=env_factory)


def callback_enabled(node: Any) -> bool:
    """Whether a `callbacks.NAME` entry is on: not null and not `enabled: false`."""
    return node is not None and node.get("enabled", True) is not False


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
    """The Lightning Trainer of the `trainer` node with the `logger` node's logger (or none):
    atomic checkpoint writes, the run folder as its root; `callbacks.model_checkpoint.enabled:
    false` also turns off Lightning's own default checkpointing."""
    from frlab.learner.checkpoint import AtomicCheckpointIO

    checkpoints = callback_enabled((cfg.get("callbacks") or {}).get("model_checkpoint"))
    extra = {} if checkpoints else {"enable_checkpointing": False}
    logger = False if cfg.get("logger") is None else instantiate(cfg.logger, key="logger")
    return instantiate(
        cfg.trainer,
        key="trainer",
        callbacks=callbacks,
        logger=logger,
        plugins=[AtomicCheckpointIO()],
        default_root_dir=str(output_dir),
        **extra,
    )


def declared_learner_sections() -> dict[str, dict[str, Any]]:
    """The sections `LearnerSettings.from_sections` reads, at their declared defaults."""
    import dataclasses

    from frlab.config import schema

    model = schema.ModelConfig
    return {
        "data": dataclasses.asdict(schema.DataConfig()),
        "optim": dataclasses.asdict(schema.OptimConfig()),
        "model": {
            k: getattr(model, k) for k in ("logprob_chunk_size", "routing_replay", "compile")
        },
        "trainer": {"max_steps": schema.TrainerConfig.max_steps},
        "rollout": {"sampling": dataclasses.asdict(schema.SamplingConfig())},
    }


def build_learner(
    policy: Any,
    objective: Any,
    optim: Mapping[str, Any] | None = None,
    *,
    model: Mapping[str, Any] | None = None,
    record: Mapping[str, Any] | None = None,
    **settings: Any,
) -> Any:
    """A `FlashReinforceModule` as a Python caller (a bench, a notebook) builds one without a
    run's config: every setting at its declared default (frlab.config.schema) but the `optim`
    and `model` keys given (AdamW's and the learner's) and `settings` (LearnerSettings fields:
    batch_size, micro_batch_size, ...); `objective` is an Objective or its config mapping."""
    import dataclasses
    import functools

    import torch

    from frlab.learner import FlashReinforceModule, LearnerSettings
    from frlab.objective import Objective

    sections = declared_learner_sections()
    sections["optim"].update(optim or {})
    sections["model"].update({k: v for k, v in (model or {}).items() if k in sections["model"]})
    values = sections["optim"]
    adamw = functools.partial(
        torch.optim.AdamW,
        lr=values["lr"],
        eps=values["eps"],
        weight_decay=values["weight_decay"],
        betas=tuple(values["betas"]),
    )
    if not isinstance(objective, Objective):
        objective = Objective.from_config(dict(objective))
    learner = dataclasses.replace(LearnerSettings.from_sections(sections), **settings)
    return FlashReinforceModule(policy, objective, adamw, learner, record=record)


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
