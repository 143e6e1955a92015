"""Before anything heavy: every dataset file, game folder and model source a run needs exists.

A missing evaluation set used to surface at the first evaluation (step 50) as a raw
`FileNotFoundError`. `check_availability(cfg)` looks, without loading or downloading anything:

- `model.name_or_path` and `model.tokenizer`: a local folder, a `gguf:` file that exists (named
  `gguf:` packages are fetched on first use), or a hub id; offline (HF_HUB_OFFLINE /
  TRANSFORMERS_OFFLINE) a hub id must be in the local Hugging Face cache;
- the training environment: its class's `Env.missing_sources(kwargs)` (math datasets, the
  Python tool's task file, ALFWorld's game folder);
- the evaluation benchmarks: math sources (`eval.kind=math`) and each episode benchmark's
  environment node (the training `env` node with the benchmark's changes).

The first problem found is a ConfigError naming its key (exit code 2).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from frlab.config.errors import ConfigError

_TRUE = {"1", "ON", "YES", "TRUE"}


def check_availability(cfg: DictConfig) -> None:
    """Raise ConfigError naming the key of the first missing dataset, folder or model."""
    for key, problem in problems(cfg):
        raise ConfigError(key, problem)


def problems(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """(config key, what is missing) for everything the run needs that is not available."""
    model = _plain(cfg.get("model")) or {}
    for key in ("name_or_path", "tokenizer"):
        problem = model_source_problem(model.get(key))
        if problem:
            yield f"model.{key}", problem
            break  # the tokenizer usually follows name_or_path: report the source once
    yield from data_problems(cfg)


def data_problems(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """(config key, what is missing) for the training environment and every benchmark."""
    env = _plain(cfg.get("env")) or {}
    yield from _env_problems(env, {}, "env")
    evaluation = _plain(cfg.get("eval"))
    if isinstance(evaluation, Mapping):
        yield from _eval_problems(evaluation, env)


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE forbid hub downloads."""
    flags = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    return any(os.environ.get(k, "").strip().upper() in _TRUE for k in flags)


def model_source_problem(source: Any) -> str | None:
    """Why a model or tokenizer source is unavailable, or None (see the module docstring)."""
    if source is None or source == "toy":
        return None
    text = str(source)
    if text.startswith("gguf:"):
        target = text[len("gguf:") :]
        if target.endswith(".gguf") and not Path(target).expanduser().is_file():
            return f"GGUF file not found: {target}"
        return None
    path = Path(text).expanduser()
    if path.is_dir():
        return None
    if path.is_absolute() or text.startswith((".", "~")) or path.exists():
        return f"{text!r} is not an existing model folder"
    if hub_offline() and not _in_hub_cache(text):
        return (
            f"{text!r} is not a local folder and not in the Hugging Face cache, and "
            "HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE is set: download it where there is network "
            "(huggingface-cli download) or pass a local folder"
        )
    return None


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # an id huggingface_hub rejects (e.g. bad characters)
        return False
    return isinstance(found, str)


def _env_problems(
    env: Mapping[str, Any], changes: Mapping[str, Any], key: str
) -> Iterator[tuple[str, str]]:
    """Problems of one env node (`changes` applied; keys named where they were set)."""
    node = {**env, **changes}
    target = node.get("_target_")
    if not isinstance(target, str):
        return
    try:
        from hydra.utils import get_class

        env_class = get_class(target)
    except Exception:  # an unknown class is reported by instantiation, naming env._target_
        return
    missing = getattr(env_class, "missing_sources", None)
    if not callable(missing):
        return
    kwargs = {k: v for k, v in node.items() if not k.startswith("_")}
    for name, problem in missing(kwargs).items():
        yield (f"{key}.{name}" if name in changes else f"env.{name}"), problem


def named_benchmarks(evaluation: Mapping[str, Any]) -> dict[str, Any]:
    """`eval.benchmarks` as `{name: spec}` (a list named as frlab.evaluation.benchmarks does);
    empty when it is malformed: preflight reports that, naming the key."""
    from frlab.evaluation.benchmarks import benchmark_specs

    try:
        return benchmark_specs(evaluation.get("benchmarks") or {})
    except ValueError:
        return {}


def _eval_problems(
    evaluation: Mapping[str, Any], env: Mapping[str, Any]
) -> Iterator[tuple[str, str]]:
    benchmarks = named_benchmarks(evaluation)
    if evaluation.get("kind") == "episodes":
        for name, changes in benchmarks.items():
            yield from _env_problems(env, changes or {}, f"eval.benchmarks.{name}")
        return
    from envs.math.datasets import source_problem

    for name, spec in benchmarks.items():
        if isinstance(spec, str):
            problem = source_problem(spec)
        elif isinstance(spec, Mapping):
            problem = source_problem(spec.get("source"), spec.get("split"), spec.get("subset"))
        else:
            continue  # an in-memory list of problems
        if problem:
            yield f"eval.benchmarks.{name}", problem


def _plain(node: Any) -> Any:
    if isinstance(node, DictConfig):
        try:
            return OmegaConf.to_container(node, resolve=True)
        except Exception:  # an unresolvable node: preflight reports it with its key
            return None
    return node
