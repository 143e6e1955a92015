"""The dry run's memory plan: what one GPU of a run holds, from the model's config alone.

The model is built on PyTorch's meta device (no weight is read or allocated), with its LoRA
adapters when `model.lora` asks for them, to count its parameters and the trainable ones.
Per GPU, in bytes:

- learner weights: every parameter in `model.dtype`;
- gradients and AdamW's two moments: the trainable parameters, in their own dtype (peft keeps
  adapters in float32 beside a bfloat16 base); an FSDP2 strategy shards weights, gradients
  and moments over the ranks;
- activations, an estimate: per token of the largest micro-batch (`data.max_tokens_per_micro
  _batch`, else `data.micro_batch_size` x `rollout.max_len`) and layer, a Llama-style block
  keeps about 8 x hidden + 3 x intermediate values for backward (attention by sdpa, no
  T x T term); with activation checkpointing one hidden state per layer plus one block
  recomputed; plus two chunks of float32 logits (the backward's chunk and its low-precision
  copy, with room to spare): `model.logprob_chunk_size` rows at most, capped at the largest
  chunk a GPU takes (frlab.ops.logprobs.CUDA_CHUNK_CAP bytes);
- an in-process vLLM engine on the same GPU (`rollout/engine=vllm`): vLLM reserves its
  `gpu_memory_utilization` share of the GPU for its own weights (bfloat16 unless
  `vllm_engine_args.dtype` says otherwise) and the KV cache of `rollout.max_in_flight`
  sequences of `rollout.max_len` tokens; the learner must fit in the rest.

The model's config comes from `model.config` (random init), a local folder, or the Hugging Face
cache (never downloaded): a hub model that is not cached gets no plan, and the line says how
to fetch its config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
VLLM_DEFAULT_SHARE = 0.9  # vLLM's own gpu_memory_utilization default


@dataclass
class MemoryPlan:
    """Bytes on one GPU (see the module docstring)."""

    params: int
    trainable: int
    weights: int
    grads: int
    optimizer: int
    activations: int
    engine: int | None = None  # the in-process vLLM engine's weights + KV cache
    engine_share: float | None = None  # its gpu_memory_utilization

    @property
    def learner(self) -> int:
        return self.weights + self.grads + self.optimizer + self.activations

    def gpu_needed(self) -> int:
        """The smallest GPU this fits on: the learner in what vLLM leaves, vLLM in its share."""
        if self.engine is None or self.engine_share is None:
            return self.learner
        return int(max(self.learner / (1 - self.engine_share), self.engine / self.engine_share))

    def describe(self) -> str:
        text = (
            f"{count(self.params)} params ({count(self.trainable)} trainable); "
            f"learner {gib(self.learner)} per device (weights {gib(self.weights)}, grads "
            f"{gib(self.grads)}, AdamW {gib(self.optimizer)}, activations ~"
            f"{gib(self.activations)})"
        )
        if self.engine is not None:
            text += (
                f"; vLLM {gib(self.engine)} (weights + KV) within its {self.engine_share:.0%} share"
            )
        return f"{text}; needs a device of >= {gib(self.gpu_needed())}"


def gib(n: float) -> str:
    """Bytes in GiB (MiB below one GiB)."""
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2**20:.0f} MiB"


def count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def model_config(model: Mapping[str, Any]) -> Any | None:
    """The model's transformers config without a download (None: not on this machine;
    transformers is imported only once a config file is found)."""
    if model.get("config"):
        from frlab.model.policy import make_config

        return make_config(dict(model["config"]))
    folder = config_folder(model.get("name_or_path"))
    if folder is None:
        return None
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(
        str(folder), trust_remote_code=bool(model.get("trust_remote_code", False))
    )


def config_folder(source: Any) -> Path | None:
    """The local folder holding `source`'s config.json: a model folder, a converted `gguf:`
    source, or the snapshot of a hub id in the Hugging Face cache."""
    if not source:
        return None
    if str(source).startswith("gguf:"):
        from frlab.model.gguf import converted_folder

        return converted_folder(str(source))
    if Path(str(source)).is_dir():
        return Path(str(source)) if (Path(str(source)) / "config.json").is_file() else None
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(str(source), "config.json")
    except ValueError:  # not a valid hub id
        return None
    return Path(found).parent if isinstance(found, str) else None


def count_parameters(config: Any, lora: Mapping[str, Any] | None) -> tuple[int, int, int]:
    """(all parameters, trainable ones, bytes of the trainable ones) of the model built on
    the meta device, with its adapters when `lora` is enabled."""
    import torch
    from transformers import AutoModelForCausalLM

    from frlab.model.lora import apply_lora, enabled

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
        total = sum(p.numel() for p in model.parameters())
        if not enabled(lora):
            return total, total, 0
        model = apply_lora(model, dict(lora))
    trainable = [p for p in model.parameters() if p.requires_grad]
    return (
        total,
        sum(p.numel() for p in trainable),
        sum(p.numel() * p.element_size() for p in trainable),
    )


def activation_bytes(
    config: Any, tokens: int, checkpointing: bool, act_bytes: int, chunk: int
) -> int:
    """The activation estimate of the module docstring for one micro-batch of `tokens`."""
    return tokens * activation_per_token(config, checkpointing, act_bytes) + head_chunk_bytes(
        config, min(tokens, chunk)
    )


def activation_per_token(config: Any, checkpointing: bool, act_bytes: int) -> int:
    """Activation bytes kept per token of a micro-batch (module docstring), the head aside."""
    text = text_config(config)
    hidden, layers = int(text.hidden_size), int(text.num_hidden_layers)
    inner = int(getattr(text, "intermediate_size", None) or 4 * hidden)
    block = (8 * hidden + 3 * inner) * act_bytes
    return hidden * layers * act_bytes + block if checkpointing else block * layers


def head_chunk_bytes(config: Any, rows: int) -> int:
    """Two float32 chunks of `rows` logits rows, as capped on a GPU."""
    from frlab.ops.logprobs import CUDA_CHUNK_CAP, capped_rows

    vocab = int(text_config(config).vocab_size)
    return 2 * capped_rows(rows, vocab, CUDA_CHUNK_CAP) * vocab * 4


def text_config(config: Any) -> Any:
    """The language model's config (a multimodal config's text part, else itself)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def kv_bytes_per_token(config: Any, dtype_bytes: int) -> int:
    """Bytes of K and V cache per token of a transformers `config` (every layer, KV heads)."""
    text = text_config(config)
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    return 2 * int(text.num_hidden_layers) * kv_heads * head_dim * int(dtype_bytes)


def kv_cache_bytes(config: Any, sequences: int, length: int, dtype_bytes: int) -> int:
    """The KV cache of `sequences` sequences of `length` tokens (vLLM's CPU sizing per token)."""
    return kv_bytes_per_token(config, dtype_bytes) * int(sequences) * int(length)


def memory_plan(
    cfg: Mapping[str, Any], engine_reserves_share: bool = False, config: Any = None
) -> MemoryPlan | None:
    """The plan of a resolved run config (None: the model's config is not on this machine).
    `engine_reserves_share`: the engine class's `reserves_gpu_share` (vLLM in-process: its
    weights and KV cache take gpu_memory_utilization of the learner's GPU); `config`: the
    model's transformers config (else read from the `model` section)."""
    model, data, rollout, trainer = cfg["model"], cfg["data"], cfg["rollout"], cfg["trainer"]
    config = config if config is not None else model_config(model)
    if config is None:
        return None
    total, trainable, trainable_bytes = count_parameters(config, model.get("lora"))
    weight_bytes = DTYPE_BYTES.get(str(model.get("dtype", "float32")), 4)
    state_bytes = trainable_bytes or trainable * weight_bytes
    shards = 1
    if "FSDP" in str(_target(trainer.get("strategy"))):
        shards = int(trainer.get("devices", 1) or 1) * int(trainer.get("num_nodes", 1) or 1)
    tokens = data.get("max_tokens_per_micro_batch") or data["micro_batch_size"] * rollout["max_len"]
    act = 2 if "16" in str(trainer.get("precision", "")) else weight_bytes
    plan = MemoryPlan(
        params=total,
        trainable=trainable,
        weights=total * weight_bytes // shards,
        grads=state_bytes // shards,
        optimizer=2 * state_bytes // shards,
        activations=activation_bytes(
            config,
            int(tokens),
            bool(model.get("gradient_checkpointing")),
            act,
            int(model.get("logprob_chunk_size") or 1024),
        ),
    )
    share = engine_share(rollout, engine_reserves_share)
    if share is not None:
        args = rollout.get("vllm_engine_args") or {}
        served = DTYPE_BYTES.get(str(args.get("dtype", "bfloat16")), 2)
        kv = kv_cache_bytes(config, int(rollout["max_in_flight"]), int(rollout["max_len"]), served)
        plan.engine = total * served + kv
        plan.engine_share = share
    return plan


def engine_share(rollout: Mapping[str, Any], engine_reserves_share: bool) -> float | None:
    """The share of the learner's GPU an in-process engine reserves (None: it takes none)."""
    if not (engine_reserves_share and str(rollout.get("device", "")).startswith("cuda")):
        return None
    args = rollout.get("vllm_engine_args") or {}
    return float(args.get("gpu_memory_utilization", VLLM_DEFAULT_SHARE))


def _target(node: Any) -> str:
    return str(node.get("_target_", "")) if isinstance(node, Mapping) else str(node)


def describe_memory(
    cfg: Mapping[str, Any], engine_reserves_share: bool = False, config: Any = None
) -> str:
    """The plan's `memory` line (`engine_reserves_share`, `config`: as for `memory_plan`)."""
    plan = memory_plan(cfg, engine_reserves_share, config)
    if plan is None:
        source = cfg["model"].get("name_or_path")
        if str(source).startswith("gguf:"):
            return f"unknown until {source} is converted (the first run does it)"
        return (
            f"unknown: {source}'s config.json is not on this machine (cache it: "
            f"huggingface-cli download {source} config.json)"
        )
    return plan.describe()
