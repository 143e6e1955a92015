"""Building, loading and saving the policy (a Hugging Face causal LM).

`build_policy` either loads a checkpoint with `AutoModelForCausalLM.from_pretrained` (a local
folder or a hub id; the real loading code, no re-implementation) or builds a random-init model
from a config mapping with a `model_type` (tiny models for CPU tests and the toy run).
`tiny_config` gives such configs for the architectures frlab targets: dense Qwen2 and Llama,
and the Qwen3-MoE family of the FlashREINFORCE paper's 30B-A3B setting. Bad input raises a
ValueError naming the field; a hub id that is not cached while offline says so plainly instead
of surfacing a network error.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from frlab.errors import ConfigError
from frlab.model.gguf import resolve_model_source
from frlab.model.hub import hub_offline
from frlab.model.lora import apply_lora
from frlab.model.lora import enabled as lora_enabled
from frlab.registry import close_matches

_TINY_COMMON: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2": dict(_TINY_COMMON),
    "llama": dict(_TINY_COMMON),
    "qwen3_moe": {
        **_TINY_COMMON,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "decoder_sparse_step": 1,
        "norm_topk_prob": True,
    },
}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """`model.dtype` (a torch dtype's name, one of the declared choices) as a torch.dtype."""
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    found = getattr(torch, str(dtype), None)
    if not isinstance(found, torch.dtype) or not found.is_floating_point:
        raise ConfigError("model.dtype", f"{dtype!r} is not a floating-point torch dtype's name")
    return found


def tiny_config(model_type: str = "qwen2", **overrides: Any) -> PretrainedConfig:
    """A tiny random-init config (hidden 64, 2 layers) for `qwen2`, `llama` or `qwen3_moe`."""
    if model_type not in TINY_CONFIGS:
        raise ValueError(
            f"tiny_config model_type {model_type!r} is not one of {', '.join(TINY_CONFIGS)}"
        )
    return make_config({"model_type": model_type, **TINY_CONFIGS[model_type], **overrides})


def make_config(config: Mapping[str, Any]) -> PretrainedConfig:
    """A transformers config from a mapping with `model_type` (undeclared keys warn)."""
    values = _plain_mapping(config)
    model_type = values.pop("model_type", None)
    if not isinstance(model_type, str) or not model_type:
        raise ConfigError("model.config.model_type", "is required to build a random-init model")
    try:
        cfg = AutoConfig.for_model(model_type, **values)
    except ValueError as exc:
        if "Unrecognized model identifier" not in str(exc):
            raise ConfigError("model.config", f"is invalid for {model_type!r}: {exc}") from exc
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        hint = close_matches(model_type, list(CONFIG_MAPPING.keys()))
        more = f"; did you mean {' or '.join(map(repr, hint))}?" if hint else ""
        raise ConfigError("model.config.model_type", f"{model_type!r} is unknown{more}") from exc
    _warn_unknown_keys(cfg, values)
    return cfg


def _plain_mapping(config: Mapping[str, Any]) -> dict[str, Any]:
    """A plain dict copy (OmegaConf containers resolved) of a config mapping."""
    if type(config).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return dict(OmegaConf.to_container(config, resolve=True))  # type: ignore[arg-type]
    return dict(config)


def _warn_unknown_keys(cfg: PretrainedConfig, values: Mapping[str, Any]) -> None:
    """transformers stores undeclared kwargs silently, so a typo does nothing: warn about them.

    Only a warning: some models read undeclared keys with `getattr` (Qwen3-MoE's `head_dim`).
    """
    if not dataclasses.is_dataclass(cfg):
        return  # remote-code configs: no declared fields to check against
    known = {f.name for f in dataclasses.fields(cfg)} | set(getattr(cfg, "attribute_map", {}))
    for key in values:
        if key not in known and key in vars(cfg):
            hint = close_matches(key, sorted(known))
            more = f" (did you mean {' or '.join(map(repr, hint))}?)" if hint else ""
            warnings.warn(
                f"model.config.{key} is not a declared {cfg.model_type} config field{more}; "
                "transformers keeps it, but the model may ignore it",
                UserWarning,
                stacklevel=3,
            )


def default_attn_implementation() -> str | None:
    """None: transformers' default, `sdpa` wherever the model supports it, on CPU and GPU.

    On a CPU, sdpa is the faster exact choice (`bench/learner.py --attention`): it agrees with
    `eager` to float32 rounding, and in float64 it is the more exact of the two (transformers'
    eager attention takes its softmax in float32).
    """
    return None


def build_policy(
    *,
    name_or_path: str | None,
    config: Mapping[str, Any] | PretrainedConfig | None,
    dtype: str,
    gradient_checkpointing: bool,
    trust_remote_code: bool,
    attn_implementation: str | None,
    lora: Mapping[str, Any],
    seed: int | None,
) -> PreTrainedModel:
    """Load a causal LM from `name_or_path` or random-init one from `config`.

    The arguments are the `model` keys (frlab.config.schema.ModelConfig: their one declaration
    and default; a Python caller takes them from `declared_arguments(ModelConfig, ...)`) and
    the run's seed.

    name_or_path: a local folder, a hub id, or a `gguf:` source (frlab.model.gguf: converted
    once into a cached folder), loaded by `AutoModelForCausalLM.from_pretrained` (a
    `PretrainedConfig` in `config` is passed along). Otherwise `config` (a mapping with
    `model_type`, or a `PretrainedConfig`) builds a random-init model, seeded by `seed` without
    touching the global RNG. `attn_implementation=None` is transformers' default (sdpa where the
    model supports it, else eager); a string is passed to transformers as is. `lora` (the
    `model.lora` node) with rank > 0 wraps the model in LoRA adapters (frlab.model.lora).
    """
    torch_dtype = resolve_dtype(dtype)
    attn = attn_implementation if attn_implementation is not None else default_attn_implementation()
    kwargs: dict[str, Any] = {"dtype": torch_dtype, "trust_remote_code": trust_remote_code}
    if attn is not None:
        kwargs["attn_implementation"] = attn
    if name_or_path is not None:
        model = _load_pretrained(name_or_path, config, kwargs)
    elif config is not None:
        model = _random_init(config, seed, kwargs)
    else:
        raise ValueError("set model.name_or_path (a local folder or hub id) or model.config")
    if gradient_checkpointing:
        model.config.use_cache = False
        enable_checkpointing(model)
    if lora_enabled(lora):  # the base frozen, adapters trainable (frlab.model.lora)
        model = apply_lora(model, lora)
    return model


def enable_checkpointing(model: PreTrainedModel) -> None:
    """Non-reentrant activation checkpointing (transformers renamed the API in 5.2x)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def checkpoint_policy(policy: Any) -> None:
    """Activation checkpointing on a built policy (inside a LoRA wrapper: its base model), as
    `build_policy(gradient_checkpointing=True)` turns it on."""
    from frlab.model.lora import base_of

    base = base_of(policy)
    base.config.use_cache = False
    enable_checkpointing(base)


def _random_init(
    config: Mapping[str, Any] | PretrainedConfig, seed: int | None, kwargs: dict[str, Any]
) -> PreTrainedModel:
    if isinstance(config, PretrainedConfig):
        cfg = config
    elif isinstance(config, Mapping):
        cfg = make_config(config)
    else:
        raise ConfigError(
            "model.config", f"must be a mapping or PretrainedConfig, got {type(config)}"
        )
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed must be an int or None, got {seed!r}")
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(cfg, **kwargs)


class ModelNotCachedError(OSError):
    """A hub id that is neither a local folder nor in the local cache while offline."""


def _load_pretrained(name_or_path: str, config: Any, kwargs: dict[str, Any]) -> PreTrainedModel:
    if not isinstance(name_or_path, (str, os.PathLike)) or not str(name_or_path):
        raise ConfigError("model.name_or_path", f"must be a non-empty string, got {name_or_path!r}")
    if isinstance(config, PretrainedConfig):
        kwargs = {**kwargs, "config": config}
    elif config is not None:
        raise ValueError(
            "give model.name_or_path or model.config, not both "
            "(set model.config=null to load a checkpoint)"
        )
    name_or_path = resolve_model_source(str(name_or_path))  # `gguf:` sources -> a folder
    path = Path(os.path.expanduser(str(name_or_path)))
    looks_local = path.is_absolute() or str(name_or_path).startswith((".", "~"))
    if looks_local and not path.is_dir():
        raise ConfigError("model.name_or_path", f"{str(name_or_path)!r} is not an existing folder")
    try:
        return AutoModelForCausalLM.from_pretrained(
            str(path if path.is_dir() else name_or_path), **kwargs
        )
    except OSError as exc:
        if path.is_dir() or not hub_offline():
            raise
        raise ModelNotCachedError(
            f"model {str(name_or_path)!r} is not in the local Hugging Face cache and "
            "HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE is set, so it cannot be downloaded; "
            "download it where there is network or pass a local folder"
        ) from exc


def save_policy(model: PreTrainedModel, path: str | os.PathLike[str]) -> Path:
    """Write `model` as safetensors + config.json into folder `path` (created); returns it."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    return out
