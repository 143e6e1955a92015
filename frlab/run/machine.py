"""Before a real run starts: is what the config needs on this machine? (fast, offline)

`check_machine(cfg)` runs once per real job of `python -m frlab` (the Hydra callback
frlab.run.hydra_record.CheckMachine; not for `dry_run=true`) and costs well under a second: it
imports neither torch nor transformers, and loads or downloads nothing. It
checks

- devices: a GPU trainer (`trainer.accelerator=gpu|cuda`) or a CUDA `rollout.device` need a
  GPU that this machine exposes (NVIDIA or ROCm device files, unless CUDA_VISIBLE_DEVICES
  hides them all);
- the model and tokenizer sources (`model.name_or_path`, `model.tokenizer`), as
  `frlab.model.hub.source_problem` judges them: a local path must be an existing folder, a
  `gguf:` source a known GGUF or an existing file, and offline a hub id must be cached;
- data files: the environment's `data_dir` / `data_path` and a file `source`, and the same
  keys of every evaluation benchmark;
- then what each environment class declares it reads (`Env.missing_sources`: math datasets,
  the Python tool's task file, ALFWorld's game folders), for the training env and for each
  episode benchmark's env node (the training node with the benchmark's changes), and each math
  benchmark's source.

The first problem is a `ConfigError` naming its key (exit code 2), with the way to check a
config without the machine it needs: `dry_run=true`.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from frlab.config.errors import ConfigError
from frlab.model.hub import source_problem

DRY_RUN_HINT = "to check the configuration and see the plan without running it, add dry_run=true"
# Device files that exist when a GPU is usable: NVIDIA (Linux), ROCm, WSL.
GPU_DEVICE_FILES = (
    "/dev/nvidiactl",
    "/dev/nvidia0",
    "/proc/driver/nvidia/gpus",
    "/dev/kfd",
    "/dev/dxg",
)
DATA_FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


def gpu_visible() -> bool:
    """Whether this machine may expose a GPU to torch (no torch import: device files only)."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1"):
        return False
    if platform.system() == "Darwin":
        return True  # Apple GPUs (mps) have no device file
    return any(os.path.exists(p) for p in GPU_DEVICE_FILES)


def check_machine(cfg: DictConfig) -> None:
    """Devices, then model sources, then data files, then what each environment and benchmark
    declares it reads; ConfigError naming the key."""
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
        if (
            not isinstance(value, str)
            or value == "toy"
            or (key != "model.name_or_path" and value == source)
        ):
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


def data_problems(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """(config key, what is missing) for the training environment and every benchmark."""
    env = _plain(cfg.get("env"))
    yield from _env_problems(env, {}, "env")
    yield from _eval_problems(_plain(cfg.get("eval")), env)


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
    from envs.math.datasets import source_problem as dataset_problem

    for name, spec in benchmarks.items():
        if isinstance(spec, str):
            problem = dataset_problem(spec)
        elif isinstance(spec, Mapping):
            problem = dataset_problem(spec.get("source"), spec.get("split"), spec.get("subset"))
        else:
            continue  # an in-memory list of problems
        if problem:
            yield f"eval.benchmarks.{name}", problem
