"""Typed field specs for frlab's config sections (the keys of frlab/config/SCHEMA.md).

Hydra configs here are plain YAML (no structured configs), so a typo in an experiment file or
a value of the wrong type would otherwise travel silently into the run. `check_section`
rejects unknown keys (suggesting close matches), missing keys, wrong types and out-of-range
values, always naming the full key. Cross-field rules live in `frlab.config.preflight`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from frlab.config.errors import ConfigError, unknown

ROOT_KEYS = (
    "seed", "dry_run", "ckpt_path", "task_name", "plots", "model", "env", "rollout", "data",
    "objective", "optim", "trainer", "logger", "callbacks", "paths", "hydra", "eval",
)  # fmt: skip

# lightning.Trainer.__init__ parameters (Lightning 2.6; tests/config checks the installed one).
TRAINER_KEYS = (
    "accelerator", "strategy", "devices", "num_nodes", "precision", "logger", "callbacks",
    "fast_dev_run", "max_epochs", "min_epochs", "max_steps", "min_steps", "max_time",
    "limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches",
    "overfit_batches", "val_check_interval", "check_val_every_n_epoch", "num_sanity_val_steps",
    "log_every_n_steps", "enable_checkpointing", "enable_progress_bar", "enable_model_summary",
    "accumulate_grad_batches", "gradient_clip_val", "gradient_clip_algorithm", "deterministic",
    "benchmark", "inference_mode", "use_distributed_sampler", "profiler", "detect_anomaly",
    "barebones", "plugins", "sync_batchnorm", "reload_dataloaders_every_n_epochs",
    "default_root_dir", "enable_autolog_hparams", "model_registry",
)  # fmt: skip

# Trainer arguments frlab sets itself, or that contradict manual optimisation.
TRAINER_FORBIDDEN = {
    "logger": "choose a logger with the `logger` group (logger=csv|tensorboard|wandb)",
    "callbacks": "add callbacks under the `callbacks` group",
    "plugins": "frlab installs AtomicCheckpointIO itself",
    "accumulate_grad_batches": "one optimizer step per learner batch; use data.micro_batch_size",
    "gradient_clip_val": "manual optimisation clips in the learner; use optim.grad_clip",
    "gradient_clip_algorithm": "manual optimisation clips in the learner; use optim.grad_clip",
    "max_epochs": "the rollout stream is endless; use trainer.max_steps",
}

PRECISIONS = (
    "32-true", "32", "64-true", "64", "bf16-mixed", "bf16-true", "16-mixed", "16-true",
    "transformer-engine",
)  # fmt: skip
ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "tpu", "auto")


@dataclass(frozen=True)
class Field:
    """One config value: its type, whether null is allowed, choices and an inclusive range."""

    kind: str  # "int" | "float" | "bool" | "str" | "mapping" | "any" | "float_pair"
    optional: bool = False
    choices: tuple[str, ...] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # exclude `low` itself
    high_open: bool = False


def _f(kind: str, **kw: Any) -> Field:
    return Field(kind, **kw)


MODEL = {
    "name_or_path": _f("str", optional=True),
    "config": _f("mapping", optional=True),
    "tokenizer": _f("str"),
    "dtype": _f("str", choices=("float32", "bfloat16", "float16", "float64")),
    "gradient_checkpointing": _f("bool"),
    "logprob_chunk_size": _f("int", low=1),
    "routing_replay": _f("bool"),
    "trust_remote_code": _f("bool"),
    "attn_implementation": _f("str", optional=True),
}
ROLLOUT = {
    "mode": _f("str", choices=("async", "sync")),
    "engine": _f("str", choices=("torch", "vllm", "remote")),
    "max_in_flight": _f("int", low=1),
    "max_policy_lag": _f("int", low=0),
    "samples_per_prompt": _f("int", low=1),
    "sync_every": _f("int", low=1),
    "max_turns": _f("int", low=1),
    "max_len": _f("int", low=2),
    "sampling": _f("mapping"),
    "device": _f("str"),
    "remote": _f("mapping"),  # rollout=remote only (frlab.rollout.remote.engine)
    "vllm_engine_args": _f("mapping"),  # rollout.engine=vllm only: extra vLLM AsyncEngineArgs
}
REMOTE = {
    "servers": _f("any"),  # a non-empty list of distinct http(s) URLs (checked in preflight)
    "snapshot_dir": _f("str", optional=True),
    "weight_sync": _f("str", choices=("filesystem", "nccl")),
    "request_timeout_s": _f("float", low=0.0, low_open=True),
    "max_retries": _f("int", low=0),
    "probe_interval_s": _f("float", low=0.0, low_open=True),
    "startup_timeout_s": _f("float", low=0.0, low_open=True),
    "keep_snapshots": _f("int", low=1),
    "model": _f("str", optional=True),
    # weight_sync=nccl only (frlab.rollout.remote.nccl): the learner's NCCL rendezvous address
    # (null: this host's), port (0: a free port per group), vLLM's packed broadcast
    "nccl_master_address": _f("str", optional=True),
    "nccl_master_port": _f("int", low=0, high=65535),
    "nccl_packed": _f("bool"),
}
SAMPLING = {
    "temperature": _f("float", low=0.0, low_open=True),
    "top_p": _f("float", low=0.0, high=1.0, low_open=True),
    "top_k": _f("int", low=0),
    "max_new_tokens": _f("int", low=1),
}
DATA = {
    "batch_size": _f("int", low=1),
    "micro_batch_size": _f("int", low=1),
}
OPTIM = {
    "lr": _f("float", low=0.0, low_open=True),
    "weight_decay": _f("float", low=0.0),
    "betas": _f("float_pair", low=0.0, high=1.0, high_open=True),
    "eps": _f("float", low=0.0, low_open=True),
    "grad_clip": _f("float", low=0.0),
    "scheduler": _f("str", choices=("cosine", "constant")),
    "warmup_ratio": _f("float", low=0.0, high=1.0, high_open=True),
    "min_lr_ratio": _f("float", low=0.0, high=1.0),
    # the lr schedule's length in updates; null: trainer.max_steps (frlab.learner.optim)
    "schedule_steps": _f("int", optional=True, low=1),
}
TRAINER = {
    "_target_": _f("str"),
    "max_steps": _f("int", low=1),
    "accelerator": _f("str", choices=ACCELERATORS),
    "num_nodes": _f("int", low=1),
    "precision": _f("str", choices=PRECISIONS),
}
OPTIONAL_KEYS = {
    "model": ("trust_remote_code", "attn_implementation"),
    "rollout": ("remote", "vllm_engine_args"),
    "rollout.remote": ("nccl_master_address", "nccl_master_port", "nccl_packed"),
    "optim": ("schedule_steps",),
    "eval": ("at_start",),
}


def check_section(section: str, values: Mapping[str, Any], fields: Mapping[str, Field]) -> None:
    """Validate `values` against `fields`: no unknown or missing keys, right types and ranges."""
    for key in values:
        if key not in fields:
            raise unknown(f"{section}.{key}", f"key in `{section}`", key, fields)
    optional = OPTIONAL_KEYS.get(section, ())
    for key, spec in fields.items():
        if key not in values:
            if key in optional:
                continue
            raise ConfigError(f"{section}.{key}", "missing (required key)")
        check_value(f"{section}.{key}", values[key], spec)


def check_value(key: str, value: Any, spec: Field) -> None:
    """Raise ConfigError unless `value` fits `spec`."""
    if value is None:
        if spec.optional:
            return
        raise ConfigError(key, f"must be set ({spec.kind}), got null")
    if spec.kind == "float_pair":
        if not isinstance(value, list | tuple) or len(value) != 2:
            raise ConfigError(key, f"must be a list of two numbers, got {value!r}")
        for i, item in enumerate(value):
            check_value(
                f"{key}[{i}]",
                item,
                Field("float", low=spec.low, high=spec.high, high_open=spec.high_open),
            )
        return
    _check_type(key, value, spec.kind)
    if spec.choices is not None and value not in spec.choices:
        raise unknown(key, "value", value, spec.choices)
    if spec.kind in ("int", "float"):
        _check_range(key, float(value), spec)


def _check_type(key: str, value: Any, kind: str) -> None:
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
        "mapping": isinstance(value, Mapping),
        "any": True,
    }[kind]
    if not ok:
        raise ConfigError(key, f"must be {_article(kind)}, got {value!r} ({type(value).__name__})")


def _article(kind: str) -> str:
    return {"int": "an integer", "float": "a number", "bool": "true or false",
            "str": "a string", "mapping": "a mapping"}.get(kind, kind)  # fmt: skip


def _check_range(key: str, x: float, spec: Field) -> None:
    if math.isnan(x):
        raise ConfigError(key, "must not be NaN")
    below = spec.low is not None and (x < spec.low or (spec.low_open and x == spec.low))
    above = spec.high is not None and (x > spec.high or (spec.high_open and x == spec.high))
    if below or above:
        lo = "(" if spec.low_open else "["
        hi = ")" if spec.high_open else "]"
        low = "-inf" if spec.low is None else f"{spec.low:g}"
        high = "inf" if spec.high is None else f"{spec.high:g}"
        raise ConfigError(key, f"must be in {lo}{low}, {high}{hi}, got {x:g}")


def check_trainer(values: Mapping[str, Any]) -> None:
    """Trainer kwargs: known Lightning names, frlab-owned ones refused, core values typed."""
    for key in values:
        if key == "_target_":
            continue
        if key not in TRAINER_KEYS:
            raise unknown(f"trainer.{key}", "lightning.Trainer argument", key, TRAINER_KEYS)
        if key in TRAINER_FORBIDDEN and values[key] is not None:
            raise ConfigError(f"trainer.{key}", f"frlab sets this itself: {TRAINER_FORBIDDEN[key]}")
    for key, spec in TRAINER.items():
        if key not in values:
            raise ConfigError(f"trainer.{key}", "missing (required key)")
        check_value(f"trainer.{key}", values[key], spec)
    world_size(values)


def world_size(trainer: Mapping[str, Any]) -> int:
    """devices x num_nodes; `devices` may be an int, a list of ids, or "auto" (counts as 1)."""
    devices = trainer.get("devices", 1)
    if isinstance(devices, list | tuple):
        n = len(devices)
    elif isinstance(devices, int) and not isinstance(devices, bool):
        n = devices
    elif isinstance(devices, str) and devices == "auto":
        n = 1
    elif isinstance(devices, str) and devices.lstrip("-").isdigit():
        n = int(devices)
    else:
        raise ConfigError(
            "trainer.devices", f"must be an int, a list of ids or 'auto', got {devices!r}"
        )
    if n == -1:
        n = 1
    if n < 1:
        raise ConfigError("trainer.devices", f"must be >= 1, got {devices!r}")
    return n * int(trainer.get("num_nodes", 1))
