"""What the learner's kernels will be, in words, for the dry-run plan and the run's record.

From the resolved `model`, `data` and `trainer` sections, without loading the model: packed
attention (frlab.model.packed_attention: `varlen`, one torch varlen_attn call per layer, on a
CUDA GPU in bf16/fp16, else `sdpa` per trajectory, the reason named), the LM head's chunk rows
(frlab.ops.logprobs: bytes sized to the device), activation checkpointing, `torch.compile` of
the decoder layers, and AdamW (fused on CUDA, frlab.learner.optim). Where the GPU is not
visible here (a login node), what depends on it is said to be chosen at start.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GPU_ACCELERATORS = ("gpu", "cuda")


def compute_dtype(model: Mapping[str, Any], trainer: Mapping[str, Any]) -> str:
    """The dtype activations run in: the mixed/true precision's, else the weights'."""
    precision = str(trainer.get("precision", ""))
    if precision.startswith("bf16"):
        return "bfloat16"
    if precision.startswith("16"):
        return "float16"
    return str(model.get("dtype", "float32"))


def attention_kernel(sections: Mapping[str, Any], config: Any) -> str:
    """`varlen (...)` or `sdpa per trajectory (why)` for packed rows (`config`: the model's
    transformers config, None where it is not here)."""
    import torch

    from frlab.model.varlen import varlen_available

    if not sections["data"].get("pack_sequences", True):
        return "padded rows (the model's own attention)"
    trainer, model = sections["trainer"], sections["model"]
    dtype = getattr(torch, compute_dtype(model, trainer))
    if str(trainer.get("accelerator")) not in GPU_ACCELERATORS:
        why = varlen_available(torch.device("cpu"), dtype, None)
        return f"sdpa per trajectory ({why})"
    if not torch.cuda.is_available():
        return (
            "varlen where the GPU takes it (CUDA sm80+, bf16/fp16), else sdpa per "
            "trajectory: chosen at start"
        )
    if config is None:
        return "varlen or sdpa per trajectory: chosen at start (the model's config is not here)"
    why = varlen_available(torch.device("cuda"), dtype, config)
    return f"sdpa per trajectory ({why})" if why else "varlen (torch varlen_attn, one per layer)"


def head_chunk_rows(sections: Mapping[str, Any], config: Any) -> str:
    """The LM head's rows per chunk on the learner's device."""
    from frlab.model.memory_plan import text_config
    from frlab.ops.logprobs import CHUNK_BYTES, CUDA_CHUNK_CAP, capped_rows

    model, trainer = sections["model"], sections["trainer"]
    rows = int(model.get("logprob_chunk_size") or 1024)
    if config is None:
        return f"<= {rows} rows"
    gpu = str(trainer.get("accelerator")) in GPU_ACCELERATORS
    rows = capped_rows(rows, text_config(config).vocab_size, CUDA_CHUNK_CAP if gpu else CHUNK_BYTES)
    return f"{rows} rows{' (at most: sized to the GPU)' if gpu else ''}"


def describe_learner(sections: Mapping[str, Any], checkpointing: Any, config: Any) -> str:
    """The plan's `learner` line (`checkpointing`: resolved, or `auto` when it is not yet)."""
    model, trainer = sections["model"], sections["trainer"]
    gpu = str(trainer.get("accelerator")) in GPU_ACCELERATORS
    shown = checkpointing if isinstance(checkpointing, str) else ("on" if checkpointing else "off")
    return (
        f"attention {attention_kernel(sections, config)}; LM head "
        f"{head_chunk_rows(sections, config)}; "
        f"checkpointing {shown}; compile {'on' if model.get('compile') else 'off'}; "
        f"AdamW {'fused' if gpu else 'foreach (fused on CUDA only)'}"
    )


def learner_facts(
    sections: Mapping[str, Any],
    reserves_share: bool,
    device: tuple[int, int, str] | None,
    config: Any = None,
) -> dict[str, Any]:
    """The plan's learner facts for resolved sections: the budget and checkpointing (auto
    values chosen for `device`, frlab.model.auto_memory; `auto` where they cannot be here),
    how they were chosen, the `learner` line and the `memory` line (frlab.model.memory_plan;
    `reserves_share`: the engine takes a share of the learner's GPU; `config`: the model's
    transformers config where the section cannot give it before the model loads)."""
    from frlab.model.auto_memory import AUTO, resolve_learner_memory
    from frlab.model.memory_plan import describe_memory, engine_share, model_config

    config = config if config is not None else model_config(sections["model"])
    share = engine_share(sections["rollout"], reserves_share)
    chosen = resolve_learner_memory(sections, device, share, config)
    if chosen is None:
        tokens = sections["data"].get("max_tokens_per_micro_batch")
        checkpointing = sections["model"].get("gradient_checkpointing")
        memory = f"unknown until the {AUTO} values are chosen at start (the learner's device)"
        why = f"{AUTO}: chosen at start from the learner's device's free memory"
    else:
        tokens, checkpointing, why = (
            chosen.max_tokens_per_micro_batch,
            chosen.gradient_checkpointing,
            chosen.why,
        )
        resolved = {
            **sections,
            "data": {**sections["data"], "max_tokens_per_micro_batch": tokens},
            "model": {**sections["model"], "gradient_checkpointing": checkpointing},
        }
        memory = describe_memory(resolved, reserves_share, config)
    learner = describe_learner(sections, checkpointing, config)
    return {
        "max_tokens_per_micro_batch": tokens,
        "gradient_checkpointing": checkpointing,
        "learner": f"{learner}; {why}" if why else learner,
        "memory": memory,
    }
