"""What frlab asks the installed vLLM before it builds an engine, and how a CPU engine is set up:
vLLM's platform (its CPU build or a GPU one), what its CPU attention serves, the memory free
for its KV cache, and whether it labels tokens with weight versions (which makes in-flight
weight updates exact). vllm is imported inside these functions only."""

from __future__ import annotations

import dataclasses
import importlib.util
import typing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from frlab.rollout.engine import WEIGHT_UPDATES
from frlab.rollout.vllm.args import (
    check_cpu_memory,
    check_head_size,
    cpu_engine_options,
    cpu_kv_cache_bytes,
)


def import_vllm() -> SimpleNamespace:
    """The vLLM entry points this adapter uses (imported only when the engine starts)."""
    import vllm
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest
    from vllm.outputs import CompletionOutput
    from vllm.platforms import current_platform

    return SimpleNamespace(
        AsyncLLMEngine=vllm.AsyncLLMEngine,
        AsyncEngineArgs=vllm.AsyncEngineArgs,
        SamplingParams=vllm.SamplingParams,
        TokensPrompt=TokensPrompt,
        CompletionOutput=CompletionOutput,
        LoRARequest=LoRARequest,
        lora_ranks=_lora_ranks(),
        platform=current_platform,
    )


def _lora_ranks() -> tuple[int, ...] | None:
    """The LoRA ranks the installed vLLM accepts (its `MaxLoRARanks`), None if it names none."""
    try:
        from vllm.config.lora import MaxLoRARanks
    except ImportError:
        return None
    return tuple(int(r) for r in typing.get_args(MaxLoRARanks)) or None


def installed_platform() -> str | None:
    """The device kind the installed vLLM serves on, as vLLM's platform says ("cpu" for its
    CPU build, "cuda", ...); None when vLLM is not installed."""
    if importlib.util.find_spec("vllm") is None:
        return None
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def cpu_head_sizes() -> list[int] | None:
    """The head sizes vLLM's CPU attention backend declares (None: this vLLM does not say)."""
    try:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        return list(AttentionBackendEnum.CPU_ATTN.get_class().get_supported_head_sizes())
    except (ImportError, AttributeError, KeyError):
        return None


def available_cpu_memory() -> int | None:
    """Bytes free for vLLM's CPU KV cache, as vLLM's CPU worker counts them (its NUMA node's
    figures), else the system's MemAvailable; None when neither can be read."""
    try:
        from vllm.utils.cpu_resource_utils import get_memory_node_info

        return int(get_memory_node_info(0).available_memory)
    except Exception:  # another vLLM release: fall back to the system's figure
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def weight_bytes(folder: str) -> int:
    """Bytes of the safetensors / bin weight files of a local model folder (0 if not local)."""
    path = Path(folder)
    if not path.is_dir():
        return 0
    return sum(p.stat().st_size for p in path.glob("*") if p.suffix in (".safetensors", ".bin"))


DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def labels_tokens(vllm: SimpleNamespace, engine: Any) -> bool:
    """Whether a built engine labels each output token with its weight version: its
    `CompletionOutput` has `weight_versions` and the engine can be told the version and paused
    between steps (`update_weight_version`, `pause_generation`, `resume_generation`)."""
    output = getattr(vllm, "CompletionOutput", None)
    spans = (
        output is not None
        and dataclasses.is_dataclass(output)
        and "weight_versions" in {f.name for f in dataclasses.fields(output)}
    )
    calls = ("update_weight_version", "pause_generation", "resume_generation")
    return spans and all(callable(getattr(engine, c, None)) for c in calls)


def labels_token_versions() -> bool:
    """Whether the installed vLLM reports each output token's weight version (its
    `CompletionOutput.weight_versions` spans, 0.32+); True when vLLM is not installed (the
    newest supported release does)."""
    if importlib.util.find_spec("vllm") is None:
        return True
    from vllm.outputs import CompletionOutput

    return "weight_versions" in {f.name for f in dataclasses.fields(CompletionOutput)}


def weight_updates() -> tuple[str, ...]:
    """The weight-update modes exact on the installed vLLM, its default first: in_flight and
    resubmit only where tokens carry vLLM's own version labels (a request queued during an
    update runs on the new weights, and without labels frlab could not tell), drain always."""
    return WEIGHT_UPDATES if labels_token_versions() else ("drain",)


def cpu_options(
    model_path: str,
    options: dict[str, Any],
    kv_gib: float | None,
    sequences: int,
    dtype: str | None,
) -> dict[str, Any]:
    """The engine options on vLLM's CPU platform: a head size its attention serves, a KV
    cache sized from config that fits in free memory, eager execution, and `dtype` (the
    learner's) unless the options name one (vLLM's "auto" would serve fp32 weights in bf16)."""
    from transformers import AutoConfig

    options = dict(options)
    config = AutoConfig.from_pretrained(
        model_path, trust_remote_code=bool(options.get("trust_remote_code", False))
    )
    check_head_size(config, cpu_head_sizes())
    if dtype is not None:
        options.setdefault("dtype", dtype)
    served = str(options.get("dtype", "auto"))
    if served == "auto":
        served = str(getattr(config, "dtype", None) or "float32").removeprefix("torch.")
    kv = cpu_kv_cache_bytes(
        kv_gib,
        config,
        sequences,
        int(options.get("max_model_len", 2048)),
        DTYPE_BYTES.get(served, 4),
    )
    options = cpu_engine_options(options, kv)
    if "kv_cache_memory_bytes" in options:
        check_cpu_memory(
            int(options["kv_cache_memory_bytes"]), weight_bytes(model_path), available_cpu_memory()
        )
    return options
