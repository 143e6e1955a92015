"""The pure, CPU-testable half of the `vllm` engine adapter (frlab.rollout.vllm.engine): the
keyword arguments frlab gives vLLM's `SamplingParams` and `AsyncEngineArgs`, the check of the
built engine's log-prob mode, and the choice of this learner rank's GPU. Never imports vllm.

The `vllm_contract` tier builds vLLM's own `SamplingParams` and `AsyncEngineArgs` from these
keywords (vllm/sampling_params.py, vllm/engine/arg_utils.py) on CPU.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from frlab.errors import ConfigError
from frlab.model.memory_plan import kv_bytes_per_token
from frlab.rollout.engine import EngineError, SamplingParams
from frlab.rollout.vllm.releases import SUPPORTED
from frlab.rollout.vllm.worker_extension import WORKER_EXTENSION_CLS

PROCESSED_LOGPROBS = "processed_logprobs"
GIB = 2**30
MIN_CPU_KV_CACHE = GIB // 4  # the smallest automatic CPU KV cache
CPU_KV_MARGIN = 2.0  # automatic CPU KV cache: this many times what the sequences need
MIN_BATCHED_TOKENS = 2048  # vLLM's own default token budget of one step


def vllm_sampling_kwargs(params: SamplingParams, *, seed: int | None = None) -> dict[str, Any]:
    """Keyword arguments for `vllm.SamplingParams` that reproduce frlab's sampling contract:
    stop only on `stop_token_ids` (eos ignored, as in the torch engine), one sampled-token
    log-prob per step, no detokenisation (token in, token out), every other sampling field
    neutral and explicit (no penalty, min_p 0, top_k 0 = off)."""
    params.validate(off_policy_correction=False)
    kwargs: dict[str, Any] = {
        "n": 1,
        "temperature": float(params.temperature),
        "top_p": float(params.top_p),
        "top_k": int(params.top_k),
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "max_tokens": int(params.max_new_tokens),
        "stop_token_ids": [int(t) for t in params.stop_token_ids],
        "ignore_eos": True,
        "logprobs": 1,
        "detokenize": False,
        "skip_special_tokens": False,
    }
    if seed is not None:
        kwargs["seed"] = int(seed)
    return kwargs


def vllm_engine_kwargs(model: str, supported: Iterable[str], **options: Any) -> dict[str, Any]:
    """`AsyncEngineArgs` keywords: `model`, `options`, frlab's worker extension (weight sync by
    method name), processed log-probs and vLLM's neutral generation config (`supported`: the
    installed vLLM's field names). ValueError naming the `rollout.vllm_engine_args` key of an
    unknown option, or of one that would change what the behaviour log-probs mean."""
    names = set(supported)
    kwargs: dict[str, Any] = {"model": model, **options}
    unknown = sorted(k for k in kwargs if k not in names)
    if unknown:
        raise ConfigError(
            "rollout.vllm_engine_args",
            f"vLLM AsyncEngineArgs has no field(s): {', '.join(unknown)}",
        )
    for field in ("worker_extension_cls", "logprobs_mode", "generation_config"):
        if field not in names:
            raise ValueError(
                f"the installed vLLM has no AsyncEngineArgs.{field}, which frlab needs: install "
                f"the `vllm` extra ({SUPPORTED})"
            )
    return {**kwargs, **required_engine_options(kwargs)}


_REQUIRED = {
    "worker_extension_cls": (WORKER_EXTENSION_CLS, "update_weights calls its methods by name"),
    "logprobs_mode": (
        PROCESSED_LOGPROBS,
        "the behaviour log-probs must be those of the distribution sampled from, after temperature",
    ),
    "generation_config": (
        "vllm",
        "the model's generation_config.json would change sampling "
        "defaults, e.g. a repetition penalty the learner never applies",
    ),
}


# Engine arguments frlab sets from other config keys (a value given here would be replaced).
SET_FROM_CONFIG = {
    "model": "model.name_or_path",
    "seed": "the run's seed, per rank",
    "max_model_len": "rollout.max_len",
}


def check_user_engine_args(args: Mapping[str, Any]) -> None:
    """ValueError naming `rollout.vllm_engine_args` for an argument frlab sets from another
    config key (SET_FROM_CONFIG), or one it fixes (`required_engine_options`) set otherwise."""
    owned = sorted(set(args) & set(SET_FROM_CONFIG))
    if owned:
        where = ", ".join(f"{k} (from {SET_FROM_CONFIG[k]})" for k in owned)
        raise ConfigError("rollout.vllm_engine_args", f"frlab sets {where} itself: remove it")
    required_engine_options(args)


def required_engine_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The engine arguments frlab fixes; ValueError naming `rollout.vllm_engine_args.<key>`
    when `options` sets one of them to another value."""
    for field, (value, why) in _REQUIRED.items():
        if field in options and options[field] != value:
            raise ConfigError(
                f"rollout.vllm_engine_args.{field}",
                f"must be {value!r} ({why}), got {options[field]!r}",
            )
    return {field: value for field, (value, _) in _REQUIRED.items()}


def check_served_mode(engine: Any) -> None:
    """EngineError unless the built engine's config reports processed log-probs."""
    model_config = getattr(getattr(engine, "vllm_config", None), "model_config", None)
    mode = getattr(model_config, "logprobs_mode", None)
    if str(getattr(mode, "value", mode)) != PROCESSED_LOGPROBS:
        raise EngineError(
            f"the vLLM engine reports logprobs_mode={mode!r}, not {PROCESSED_LOGPROBS!r}: its "
            "log-probs would not be those of the distribution sampled from; refusing to start"
        )


def rank_visible_devices(index: int, visible: str | None) -> str:
    """The `CUDA_VISIBLE_DEVICES` that shows an engine only logical CUDA device `index` of
    this process: entry `index` of the inherited list `visible`, or `index` itself."""
    if index < 0:
        raise EngineError(f"CUDA device index {index} is negative")
    if visible is None or not visible.strip():
        return str(index)
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if index >= len(entries):
        raise EngineError(
            f"CUDA device {index} of this rank is not among CUDA_VISIBLE_DEVICES={visible!r}"
        )
    return entries[index]


def rank_device_index() -> int:
    """This process's CUDA device: the current one once CUDA is initialised (Lightning sets it
    per rank), else `LOCAL_RANK` (0 when unset)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.current_device())
    return int(os.environ.get("LOCAL_RANK", "0"))


@contextlib.contextmanager
def visible_devices(value: str) -> Iterator[None]:
    """Set `CUDA_VISIBLE_DEVICES` while vLLM starts its engine-core process, then restore it."""
    old = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = old


def engine_visible_devices(index: int, options: Mapping[str, Any]) -> str | None:
    """The devices this rank's engine may see (None: leave them as they are). Tensor or
    pipeline parallel engines span several GPUs and are left alone on device 0 only."""
    parallel = int(options.get("tensor_parallel_size", 1)) * int(
        options.get("pipeline_parallel_size", 1)
    )
    if parallel > 1:
        if index != 0:
            raise EngineError(
                "rollout.vllm_engine_args: a tensor/pipeline parallel in-process engine per "
                f"learner rank is not supported (this rank is on CUDA device {index}); serve "
                "the model with rollout=remote instead"
            )
        return None
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0" and index != 0:
        raise EngineError(
            "VLLM_ENABLE_V1_MULTIPROCESSING=0 runs vLLM's engine core in this process, where it "
            f"would use cuda:0, not this rank's device {index}: unset it"
        )
    return rank_visible_devices(index, os.environ.get("CUDA_VISIBLE_DEVICES"))


# -- vLLM on a CPU ---------------------------------------------------------------------------
def cpu_kv_cache_bytes(
    gib: float | None, config: Any, sequences: int, max_len: int, dtype_bytes: int = 4
) -> int:
    """The KV cache vLLM's CPU engine reserves: `gib` GiB when set, else CPU_KV_MARGIN times
    what `sequences` sequences of `max_len` tokens need, at least MIN_CPU_KV_CACHE."""
    if gib is not None:
        if not float(gib) > 0:
            raise ConfigError("rollout.engine.cpu_kv_cache_gib", f"must be > 0, got {gib}")
        return int(float(gib) * GIB)
    need = kv_bytes_per_token(config, dtype_bytes) * int(sequences) * int(max_len)
    return max(MIN_CPU_KV_CACHE, int(CPU_KV_MARGIN * need))


def cpu_engine_options(options: Mapping[str, Any], kv_cache_bytes: int) -> dict[str, Any]:
    """CPU defaults under the user's `rollout.vllm_engine_args`: an explicit KV cache size
    (vLLM's CPU default reserves `gpu_memory_utilization` of the machine's memory and refuses to
    start when that much is not free), eager execution (no minutes-long compile), and whole
    prefills: when a prompt's prefill is split across steps, vLLM rewinds the request's seeded
    generator (`Generator.set_offset`), which a CPU generator does not support, and the worker
    dies ("CPU Generator does not use offset") as soon as many seeded prompts arrive together."""
    out = dict(options)
    if "kv_cache_memory_bytes" not in out and "gpu_memory_utilization" not in out:
        out["kv_cache_memory_bytes"] = int(kv_cache_bytes)
    out.setdefault("enforce_eager", True)
    if out.setdefault("enable_chunked_prefill", False) is False:
        length = int(out.get("max_model_len") or 0)
        out.setdefault("max_num_batched_tokens", max(MIN_BATCHED_TOKENS, length))
    return out


def check_cpu_memory(kv_cache_bytes: int, weight_bytes: int, available: int | None) -> None:
    """EngineError naming `rollout.engine.cpu_kv_cache_gib` when the KV cache and the weights
    do not fit in the memory that is free now (`available` None: unknown, not checked)."""
    need = int(kv_cache_bytes) + int(weight_bytes)
    if available is None or need <= available:
        return
    raise EngineError(
        f"vLLM's CPU engine needs {kv_cache_bytes / GIB:.2f} GiB of KV cache plus "
        f"{weight_bytes / GIB:.2f} GiB of weights, but {available / GIB:.2f} GiB of memory is "
        "available: lower rollout.engine.cpu_kv_cache_gib (or rollout.max_in_flight / "
        "rollout.max_len, which size it by default), or free memory"
    )


def check_head_size(config: Any, supported: Iterable[int] | None) -> None:
    """EngineError when the model's attention head size is not one that vLLM's CPU attention
    backend serves (`supported`: the backend's own list; None: unknown, not checked)."""
    if supported is None:
        return
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
    sizes = sorted(int(x) for x in supported)
    if head_dim not in sizes:
        raise EngineError(
            f"vLLM's CPU attention does not serve head size {head_dim} (it serves "
            f"{', '.join(map(str, sizes))}): change the model (hidden_size / "
            "num_attention_heads, or head_dim) or use rollout/engine=torch"
        )
