"""The learner's profile and its plain-transformers yardstick (used by bench/gpu_mfu.py).

- `profile_update`: one learner update with frlab.ops.phases on (device synchronised at each
  phase boundary), reported as seconds per phase and the rest of the step ("other": Lightning,
  micro-batch assembly, host syncs). A profiled update is slower than a timed one: it is run
  apart from the timed updates, and its phases are read as shares.
- `plain_step_seconds`: a plain transformers training step of the same model shape on dense
  rows (`model(input_ids, labels=input_ids)`: full logits and cross-entropy, sdpa attention,
  torch's default AdamW), timed with the device synchronised, median over repeats after one
  warm-up step.
- `model_flops`: the FLOP formula both sides share (3 x forward: 2 x matmul parameters per
  token, causal attention 2 x n^2 x hidden per layer per sequence of n tokens).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

TOP_PHASES = ("decoder_forward", "lm_head_forward", "objective", "backward", "optimizer")


def matmul_params(cfg: dict) -> int:
    """Parameters that take part in matmuls per token: attention, MLP and the LM head."""
    d, ff, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    head_dim = d // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * head_dim
    per_layer = d * d + 2 * d * kv + d * d + 3 * d * ff
    return layers * per_layer + d * cfg["vocab_size"]


def model_flops(cfg: dict, lengths: list[int]) -> float:
    """Model FLOPs of one training update (forward + backward = 3 x forward)."""
    forward = 2 * matmul_params(cfg) * sum(lengths)
    forward += cfg["num_hidden_layers"] * sum(2 * n * n * cfg["hidden_size"] for n in lengths)
    return 3.0 * forward


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def profile_update(update: Any, device: str) -> dict[str, float]:
    """Seconds per phase of one update (`update()` returns the logged metrics), with `step`
    (the module's own step time) and `other` (step minus the top-level phases)."""
    from frlab.ops.phases import profiling

    with profiling(device) as tally:
        logged = update()
    seconds = {
        name: float(tally.seconds.get(name, 0.0))
        for name in (*TOP_PHASES, "attention_forward", "attention_backward", "lm_head_backward")
    }
    seconds["step"] = float(logged["timing/step_s"])
    seconds["other"] = seconds["step"] - sum(seconds[name] for name in TOP_PHASES)
    return seconds


def describe_profile(seconds: dict[str, float]) -> str:
    """One line: each phase's seconds and share of the step."""
    step = seconds["step"]
    decoder_backward = seconds["backward"] - seconds["lm_head_backward"]

    def part(label: str, value: float) -> str:
        return f"{label} {value:.3f} s ({value / step:.0%})"

    return "; ".join(
        [
            part("decoder forward", seconds["decoder_forward"]),
            part("attention forward (inside it)", seconds["attention_forward"]),
            part("LM head forward", seconds["lm_head_forward"]),
            part("objective", seconds["objective"]),
            part("decoder backward", decoder_backward),
            part("attention backward (inside it)", seconds["attention_backward"]),
            part("LM head backward", seconds["lm_head_backward"]),
            part("optimizer", seconds["optimizer"]),
            part("other (Lightning, data, host syncs)", seconds["other"]),
            f"step {step:.3f} s (synchronised at each phase)",
        ]
    )


def plain_step_seconds(
    config: Any, rows: int, width: int, device: str, dtype: torch.dtype, repeats: int
) -> float:
    """Median seconds of a plain transformers training step on `rows` dense rows of `width`."""
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.1)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (rows, width), generator=gen).to(device)
    times = []
    for _ in range(repeats + 1):
        _sync(device)
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)
        times.append(time.perf_counter() - start)
    del model, optimizer
    return statistics.median(times[1:])
