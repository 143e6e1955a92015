"""`auto` micro-batch budget and activation checkpointing, from the memory plan and the device.

`data.max_tokens_per_micro_batch=auto` and `model.gradient_checkpointing=auto` are chosen when
a run starts (and shown by the dry run where the device is visible), from the model's shape
(frlab.model.memory_plan) and the free memory of the learner's device: CUDA's free memory on
the rank's GPU (`torch.cuda.mem_get_info`), less the share an in-process vLLM engine will take
(`gpu_memory_utilization` of the whole GPU); on a CPU, the available RAM.

- What the learner holds whatever the budget (weights, gradients, AdamW moments, the LM head's
  chunk) comes off 90% of the free memory (the rest is headroom for the allocator);
- checkpointing `auto`: off when a micro-batch of at least `rollout.max_len` tokens (one whole
  trajectory) fits without it, else on (one hidden state per layer kept, the block recomputed);
- budget `auto`: the most tokens whose activations fit, in multiples of 128, at most the rank's
  whole batch (B / ranks x max_len). A budget below max_len is kept and said: a longer
  trajectory runs alone and may not fit.

An explicit number or boolean is used as given.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from frlab.model.memory_plan import (
    DTYPE_BYTES,
    activation_per_token,
    gib,
    head_chunk_bytes,
    memory_plan,
    model_config,
)

AUTO = "auto"
HEADROOM = 0.9
ROUND = 128


@dataclass(frozen=True)
class LearnerMemory:
    """The micro-batch token budget and checkpointing a run uses, and how auto chose them."""

    max_tokens_per_micro_batch: int | None
    gradient_checkpointing: bool
    why: str = ""  # '' when neither key was auto


def wants_auto(cfg: Mapping[str, Any]) -> bool:
    """Whether the budget or checkpointing of a run config is `auto`."""
    return AUTO in (
        cfg["data"].get("max_tokens_per_micro_batch"),
        cfg["model"].get("gradient_checkpointing"),
    )


def device_memory(accelerator: Any) -> tuple[int, int, str] | None:
    """(free, total, name) of the learner's device: the rank's GPU (LOCAL_RANK) for a GPU
    accelerator, the RAM for `cpu`; None where that device is not visible here."""
    if str(accelerator) in ("gpu", "cuda", "auto"):
        import torch

        if not torch.cuda.is_available():
            return None
        index = int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()
        free, total = torch.cuda.mem_get_info(index)
        return int(free), int(total), f"cuda:{index}"
    if str(accelerator) == "cpu":
        return ram()
    return None


def ram() -> tuple[int, int, str]:
    """(available, total, name) of this machine's RAM (Linux: /proc/meminfo's MemAvailable)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total, available = page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(available), int(total), "cpu RAM"


def resolve_learner_memory(
    cfg: Mapping[str, Any],
    device: tuple[int, int, str] | None = None,
    engine_share: float | None = None,
    config: Any = None,
) -> LearnerMemory | None:
    """The budget and checkpointing of a resolved run config, auto values chosen for `device`
    (`device_memory(...)`; `engine_share`: the GPU share an in-process engine takes; `config`:
    the model's transformers config, else read from the `model` section). None: an auto value
    that cannot be chosen here (no device, or the model's config unknown)."""
    data, model = cfg["data"], cfg["model"]
    tokens = data.get("max_tokens_per_micro_batch")
    checkpointing = model.get("gradient_checkpointing")
    if AUTO not in (tokens, checkpointing):
        return LearnerMemory(tokens, bool(checkpointing))
    config = config if config is not None else model_config(model)
    if device is None or config is None:
        return None
    free, total, name = device
    fixed = _fixed_bytes(cfg, config)
    reserved = int((engine_share or 0.0) * total)
    room = int(free * HEADROOM) - fixed - reserved
    act = _act_bytes(cfg)
    max_len = int(cfg["rollout"]["max_len"])
    if checkpointing == AUTO:
        checkpointing = room < max_len * activation_per_token(config, False, act)
    per_token = activation_per_token(config, bool(checkpointing), act)
    if tokens == AUTO:
        tokens = _budget(room // per_token, cfg)
    why = (
        f"auto from {gib(free)} free on {name}"
        f"{f' less {gib(reserved)} for the engine' if reserved else ''}, "
        f"{gib(fixed)} held by the learner: budget {tokens:,} tokens, checkpointing "
        f"{'on' if checkpointing else 'off'}"
    )
    if tokens is not None and tokens < max_len:
        why += f" (below rollout.max_len={max_len}: a longer trajectory may not fit)"
    return LearnerMemory(tokens, bool(checkpointing), why)


def _budget(fits: int, cfg: Mapping[str, Any]) -> int:
    """`fits` tokens in multiples of ROUND, at most the rank's whole batch, at least ROUND."""
    trainer = cfg["trainer"]
    ranks = int(trainer.get("devices", 1) or 1) * int(trainer.get("num_nodes", 1) or 1)
    whole = max(1, int(cfg["data"]["batch_size"]) // ranks) * int(cfg["rollout"]["max_len"])
    return max(ROUND, min(int(fits) // ROUND * ROUND, -(-whole // ROUND) * ROUND))


def _act_bytes(cfg: Mapping[str, Any]) -> int:
    precision = str(cfg["trainer"].get("precision", ""))
    return 2 if "16" in precision else DTYPE_BYTES.get(str(cfg["model"].get("dtype")), 4)


def _fixed_bytes(cfg: Mapping[str, Any], config: Any) -> int:
    """Weights, gradients, AdamW moments and the LM head's chunk: held whatever the budget."""
    sized = {
        **cfg,
        "model": {**cfg["model"], "gradient_checkpointing": False},
        "data": {**cfg["data"], "max_tokens_per_micro_batch": 1},
    }
    plan = memory_plan(sized, config=config)
    assert plan is not None  # the config is known here
    chunk = int(cfg["model"].get("logprob_chunk_size") or 1024)
    return plan.weights + plan.grads + plan.optimizer + head_chunk_bytes(config, chunk)
