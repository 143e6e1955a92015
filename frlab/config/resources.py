"""Before a real run starts: is what the config needs on this machine? (fast, offline)

`check_machine(cfg)` runs first in `python -m frlab` (not for `dry_run=true`) and costs well
under a second: it imports neither torch nor transformers. It checks

- devices: a GPU trainer (`trainer.accelerator=gpu|cuda`), `rollout/engine=vllm` or a CUDA
  `rollout.device` need a GPU that this machine exposes (NVIDIA or ROCm device files, unless
  CUDA_VISIBLE_DEVICES hides them all);
- the model and tokenizer sources (`model.name_or_path`, `model.tokenizer`): a local path
  must be an existing folder, a `gguf:` source must name a known GGUF or an existing file,
  and with HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE set a Hugging Face id must already be in the
  local cache (without the flags it may still be downloaded);
- data files: the environment's `data_dir` / `data_path` and a file `source`, and the same
  keys of every evaluation benchmark; then what each environment class declares it reads
  (`Env.missing_sources`: math datasets, the Python tool's task file, ALFWorld's game
  folders), for the training env and every evaluation benchmark (frlab.config.availability).

Each problem is a `ConfigError` naming the key, with the way to check a config without the
machine it needs: `dry_run=true`. `local_source_problem` is also used by preflight.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from frlab.config.availability import named_benchmarks
from frlab.config.errors import ConfigError

DRY_RUN_HINT = "to check the configuration and see the plan without running it, add dry_run=true"
# Device files that exist when a GPU is usable: NVIDIA (Linux), ROCm, WSL.
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia/gpus", "/dev/kfd",
                    "/dev/dxg")  # fmt: skip
DATA_FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
FALSE_ENV = {"", "0", "OFF", "NO", "FALSE"}


def gpu_visible() -> bool:
    """Whether this machine may expose a GPU to torch (no torch import: device files only)."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1"):
        return False
    if platform.system() == "Darwin":
        return True  # Apple GPUs (mps) have no device file
    return any(os.path.exists(p) for p in GPU_DEVICE_FILES)


def hub_offline() -> bool:
    """HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE set: nothing can be downloaded."""
    return any(
        os.environ.get(k, "").strip().upper() not in FALSE_ENV
        for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def local_source_problem(source: str) -> str | None:
    """Why a model source cannot be local as written (None: fine, or a hub id to check later)."""
    from frlab.model.gguf import GGUF_PACKAGES, GGUF_PREFIX

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


def cached_on_hub(repo_id: str) -> bool:
    """Whether a Hugging Face model id has a config in the local cache."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # not a valid repo id
        return False
    return isinstance(found, str)


def source_problem(source: str) -> str | None:
    """`local_source_problem`, then (offline) whether a hub id is in the local cache."""
    problem = local_source_problem(source)
    if problem or source.startswith("gguf:") or Path(source).expanduser().exists():
        return problem
    if hub_offline() and not cached_on_hub(source):
        return (
            f"{source!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE / "
            "TRANSFORMERS_OFFLINE forbid downloading it: download it where there is network "
            "(huggingface-cli download ID) or give a local folder"
        )
    return None


def check_machine(cfg: DictConfig) -> None:
    """Devices, then model sources, then data files, then what each environment and benchmark
    declares it reads (frlab.config.availability); ConfigError naming the key."""
    from frlab.config.availability import data_problems

    check_devices(cfg)
    check_model_sources(cfg)
    check_data_files(cfg)
    for key, problem in data_problems(cfg):
        raise ConfigError(key, f"{problem}; {DRY_RUN_HINT}")


def check_devices(cfg: DictConfig) -> None:
    if gpu_visible():
        return
    accelerator = OmegaConf.select(cfg, "trainer.accelerator", default=None)
    device = str(OmegaConf.select(cfg, "rollout.device", default="") or "")
    # rollout/engine=vllm beside a CPU learner: preflight asks the installed vLLM's platform
    needs = [
        ("trainer.accelerator", accelerator in ("gpu", "cuda"), f"is {accelerator!r}"),
        ("rollout.device", device.startswith("cuda"), f"is {device!r}"),
    ]
    for key, needed, what in needs:
        if needed:
            raise ConfigError(
                key,
                f"{what}, but this machine has no GPU (no NVIDIA/ROCm device visible): run it on "
                f"a GPU machine, or on CPU with trainer=cpu rollout/engine=torch "
                f"rollout.device=cpu; {DRY_RUN_HINT}",
            )


def check_model_sources(cfg: DictConfig) -> None:
    source = OmegaConf.select(cfg, "model.name_or_path", default=None)
    tokenizer = OmegaConf.select(cfg, "model.tokenizer", default=None)
    for key, value in (("model.name_or_path", source), ("model.tokenizer", tokenizer)):
        if not isinstance(value, str) or value == "toy" or (key != "model.name_or_path"
                                                            and value == source):  # fmt: skip
            continue
        problem = source_problem(value)
        if problem:
            raise ConfigError(key, f"{problem}; {DRY_RUN_HINT}")


def check_data_files(cfg: DictConfig) -> None:
    for key, path in data_paths(cfg):
        if not Path(path).expanduser().exists():
            raise ConfigError(key, f"{path} does not exist; {DRY_RUN_HINT}")


def data_paths(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """(key, path) of every local file or folder the env and the evaluation read."""
    env = _plain(cfg.get("env"))
    yield from _paths_of("env", env)
    ev = _plain(cfg.get("eval"))
    for name, spec in named_benchmarks(ev).items():
        key = f"eval.benchmarks.{name}"
        if isinstance(spec, str):
            yield from _paths_of(key, {"source": spec}, field=False)
        elif isinstance(spec, Mapping):
            yield from _paths_of(key, spec)


def _paths_of(key: str, node: Mapping[str, Any], field: bool = True) -> Iterator[tuple[str, str]]:
    for name in ("data_dir", "data_path", "source"):
        value = node.get(name)
        if not isinstance(value, str) or not value:
            continue
        if name == "source" and Path(value).suffix.lower() not in DATA_FILE_SUFFIXES:
            continue  # a package or hub dataset, read when first needed
        yield (f"{key}.{name}" if field else key), value


def _plain(node: Any) -> dict[str, Any]:
    if not isinstance(node, DictConfig):
        return {}
    try:
        return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]
    except Exception:  # an unresolvable value: preflight names it
        return {}
