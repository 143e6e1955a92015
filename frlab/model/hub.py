"""Where a model comes from: a local folder, a `gguf:` source or a Hugging Face hub id.

The one home of three facts that the machine check, preflight and the loader all need:
whether downloads are forbidden (`hub_offline`), whether a hub id is in the local cache
(`cached_on_hub`) and why a source cannot be used (`source_problem`). Nothing here imports
torch or transformers, so the checks before a run stay fast.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from frlab.errors import ConfigError
from frlab.model.gguf import GGUF_PACKAGES, GGUF_PREFIX

# The values huggingface_hub reads as true in its environment variables.
TRUE_VALUES = frozenset({"1", "ON", "YES", "TRUE"})


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE (else TRANSFORMERS_OFFLINE) forbids downloads, read the way
    huggingface_hub reads them: the first of the two that is set decides."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    return value is not None and value.upper() in TRUE_VALUES


def cached_on_hub(repo_id: str) -> bool:
    """Whether a Hugging Face model id has its config.json in the local cache."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # an id huggingface_hub rejects (bad characters)
        return False
    return isinstance(found, str)


def local_source_problem(source: str) -> str | None:
    """Why a model source cannot be local as written (None: fine, or a hub id)."""
    if source.startswith(GGUF_PREFIX):
        name = source[len(GGUF_PREFIX) :]
        if name.lower().endswith(".gguf"):
            path = Path(name).expanduser()
            return None if path.is_file() else f"GGUF file not found: {path}"
        if name in GGUF_PACKAGES:
            return None
        known = ", ".join(GGUF_PREFIX + n for n in GGUF_PACKAGES)
        return f"{source!r} is neither a known GGUF ({known}) nor a path to a .gguf file"
    path = Path(source).expanduser()
    if path.exists():
        return None if path.is_dir() else f"{source!r} is a file, not a model folder"
    if path.is_absolute() or source.startswith((".", "~")) or source.count("/") > 1:
        return (
            f"{source!r} is not an existing folder (expected a local folder, a Hugging Face id "
            "such as Qwen/Qwen2.5-Math-1.5B, or a gguf: source)"
        )
    return None


def source_problem(source: str) -> str | None:
    """`local_source_problem`, then (offline) whether a hub id is in the local cache."""
    problem = local_source_problem(source)
    if problem or source.startswith(GGUF_PREFIX) or Path(source).expanduser().exists():
        return problem
    if hub_offline() and not cached_on_hub(source):
        return (
            f"{source!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE / "
            "TRANSFORMERS_OFFLINE forbid downloading it: download it where there is network "
            "(huggingface-cli download ID) or give a local folder"
        )
    return None


def check_model(model: Mapping[str, Any], rollout: Mapping[str, Any]) -> None:
    """The `model` node loads a checkpoint or builds a random-init architecture (one of the
    two), and the context leaves room for the prompt (ConfigError naming the key)."""
    source, config = model["name_or_path"], model["config"]
    if source is None and config is None:
        raise ConfigError("model.name_or_path", "set a hub id / local folder, or model.config")
    problem = local_source_problem(str(source)) if source is not None else None
    if problem:
        raise ConfigError("model.name_or_path", f"{problem}")
    if source is not None and config is not None:
        raise ConfigError(
            "model.config",
            f"is set (a random-init architecture) while "
            f"model.name_or_path loads {source!r}: choose one (model=hf "
            "model.name_or_path=... loads a checkpoint; model.name_or_path=null "
            "keeps the random-init model)",
        )
    if config is not None and "model_type" not in config:
        raise ConfigError("model.config.model_type", "missing (e.g. qwen2, llama, qwen3_moe)")
    if model["compile"] and model["routing_replay"]:
        raise ConfigError(
            "model.compile",
            "true does not take model.routing_replay=true (the recorded experts are not padded "
            "like the compiled packed rows): set one to false",
        )
    max_len, new = rollout["max_len"], rollout["sampling"]["max_new_tokens"]
    if max_len <= new:
        raise ConfigError(
            "rollout.max_len",
            f"({max_len}) must exceed rollout.sampling."
            f"max_new_tokens ({new}) to leave room for the prompt",
        )
    positions = (config or {}).get("max_position_embeddings")
    if isinstance(positions, int) and max_len > positions:
        raise ConfigError(
            "rollout.max_len",
            f"({max_len}) exceeds model.config.max_position_embeddings ({positions})",
        )
