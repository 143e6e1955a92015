"""Learner throughput: packed token-budget micro-batches vs padded rows; sdpa vs eager.

One learner update (`FlashReinforceModule.training_step` under a Lightning Trainer: log-probs,
objective, backward, AdamW) on one fixed batch of B trajectories whose lengths are log-normal
(default: median 256, sigma 1, clipped to [32, 4096]; the first 20% of each is prompt), on a
random-init Qwen2 (hidden 256, 4 layers, 4 heads, vocabulary 4096, float32). The time is the
module's own `timing/step_s`; learner tokens/s = the batch's real tokens / step time.

Arms (`--compare layout`, the default), each the same model weights and batch:
- `padded`: the layout before packing: `data.micro_batch_size=--micro` consecutive rows,
  right-padded to the longest row of each micro-batch, `data.pack_sequences=false`;
- `padded_budget`: padded, but rows grouped longest-first under `--budget` rows x width tokens;
- `packed`: `data.pack_sequences=true`, `data.max_tokens_per_micro_batch=--budget`: padding-free
  rows, attention per trajectory (frlab.model.packed_attention).
`--compare attention`: the same update with the model's attention `eager` vs `sdpa`, in the
padded layout (where the choice matters; packed rows run sdpa per trajectory for both).

Arms run interleaved in one process (`--repeats` rounds after one warm-up round); medians and
the median of per-round ratios are printed. The machine may be shared: compare within a run.

Run: `python bench/learner.py` (layout) or `python bench/learner.py --compare attention`;
`--model smollm2` uses SmolLM2-135M-Instruct (`gguf:smollm2-135m-instruct`, converted once);
on a GPU: `--device cuda --dtype bfloat16 --model qwen2.5-0.5b` (scripts/gpu_packing_check.sh).
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
from typing import Any

import torch

from frlab.build import build_learner
from frlab.config.arguments import declared_arguments
from frlab.config.schema import ModelConfig
from frlab.data.batch import RolloutBatch, Trajectory, collate
from frlab.learner.module import FlashReinforceModule
from frlab.model.lm_logprobs import sequence_logprobs
from frlab.model.packed_attention import packed_attention
from frlab.model.policy import build_policy, tiny_config

OBJECTIVE = {
    "baseline": "batch_mean",
    "trust_region": "sequence_bernoulli_kl",
    "aggregation": "sample_mean",
    "token_filter": "none",
    "sequence_bernoulli_kl": {"delta": 1.0},
}
OPTIM = {"lr": 1e-6, "weight_decay": 0.1, "grad_clip": 1.0, "scheduler": "constant"}
SMALL_QWEN2 = {
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 8192,
}
QWEN25_05B = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "rope_theta": 1000000.0,
}


TOY = {
    "vocab_size": 64,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
}


def build_model(name: str, dtype: str) -> torch.nn.Module:
    """qwen2-small (random init), qwen2.5-0.5b (Qwen2.5-0.5B's shape, random init), toy (the
    toy_cpu model) or smollm2."""
    if name == "toy":
        return build_policy(
            **declared_arguments(
                ModelConfig, name_or_path=None, config=tiny_config("qwen2", **TOY), dtype=dtype
            ),
            seed=0,
        )
    if name == "qwen2-small":
        return build_policy(
            **declared_arguments(
                ModelConfig,
                name_or_path=None,
                config=tiny_config("qwen2", **SMALL_QWEN2),
                dtype=dtype,
            ),
            seed=0,
        )
    if name == "qwen2.5-0.5b":
        return build_policy(
            **declared_arguments(
                ModelConfig,
                name_or_path=None,
                config=tiny_config("qwen2", **QWEN25_05B),
                dtype=dtype,
            ),
            seed=0,
        )
    if name == "smollm2":
        return build_policy(
            **declared_arguments(
                ModelConfig, name_or_path="gguf:smollm2-135m-instruct", dtype=dtype, config=None
            ),
            seed=None,
        )
    raise SystemExit(f"--model must be qwen2-small, qwen2.5-0.5b, toy or smollm2, got {name!r}")


def lengths_of(args: argparse.Namespace) -> list[int]:
    gen = torch.Generator().manual_seed(args.seed)
    raw = (torch.randn(args.batch, generator=gen) * args.sigma + math.log(args.median)).exp()
    return raw.round().clamp(args.min_len, args.max_len).long().tolist()


def make_batch(
    model: torch.nn.Module, lengths: list[int], seed: int, prompt_frac: float = 0.2
) -> RolloutBatch:
    """Random tokens, a prompt prefix; behaviour log-probs = the model's own (admitted rows)."""
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    trajectories = []
    for i, n in enumerate(lengths):
        prompt = min(n - 1, max(1, round(n * prompt_frac)))
        trajectories.append(
            Trajectory(
                token_ids=torch.randint(0, vocab, (n,), generator=gen).tolist(),
                action_mask=[False] * prompt + [True] * (n - prompt),
                behavior_log_probs=[0.0] * prompt + [-1.0] * (n - prompt),
                token_versions=[-1] * prompt + [0] * (n - prompt),
                reward=float(i % 2),
                prompt_id=i,
            )
        )
    batch = collate(trajectories)
    device = next(model.parameters()).device
    on_device = batch.to(device)
    with torch.no_grad(), packed_attention(model):
        current, _ = sequence_logprobs(
            model,
            on_device.input_ids,
            on_device.attention_mask,
            on_device.position_ids,
            action_mask=on_device.action_mask,
            pack=True,
        )
    current = current.cpu().clamp(max=-1e-4)
    batch.behavior_log_probs = torch.where(batch.action_mask, current, 0.0).float()
    return batch


def arms(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    if args.compare == "attention":
        padded = {"micro_batch_size": args.micro, "pack_sequences": False}
        return {"eager": {**padded, "attn": "eager"}, "sdpa": {**padded, "attn": "sdpa"}}
    return {
        "padded": {"micro_batch_size": args.micro, "pack_sequences": False},
        "padded_budget": {
            "micro_batch_size": args.batch,
            "pack_sequences": False,
            "max_tokens_per_micro_batch": args.budget,
        },
        "packed": {
            "micro_batch_size": args.batch,
            "pack_sequences": True,
            "max_tokens_per_micro_batch": args.budget,
        },
    }


def one_update(module: FlashReinforceModule, batch: RolloutBatch, device: str) -> dict[str, float]:
    import lightning as L
    from torch.utils.data import DataLoader

    trainer = L.Trainer(
        accelerator="gpu" if device == "cuda" else "cpu",
        devices=1,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, DataLoader([batch], batch_size=None))
    return {k: float(v) for k, v in trainer.logged_metrics.items()}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line: which arms, the batch's length distribution, repeats and device."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", choices=("layout", "attention"), default="layout")
    parser.add_argument("--model", default="qwen2-small")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--median", type=float, default=256)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--min-len", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--micro", type=int, default=8, help="rows per padded micro-batch")
    parser.add_argument("--budget", type=int, default=8192, help="tokens per micro-batch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompt-frac", type=float, default=0.2, help="prompt share per row")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", default="float32", help="model dtype (bfloat16 on GPU)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import logging

    logging.getLogger("lightning").setLevel(logging.ERROR)
    base = build_model(args.model, args.dtype).to(args.device).train()
    lengths = lengths_of(args)
    batch = make_batch(base, lengths, args.seed, args.prompt_frac)
    real = sum(lengths)
    print(
        f"model {args.model} ({sum(p.numel() for p in base.parameters()) / 1e6:.1f}M params), "
        f"B={args.batch}, lengths median {statistics.median(lengths):g} max {max(lengths)} "
        f"total {real} tokens, torch threads {torch.get_num_threads()}"
    )
    modules = {}
    for name, spec in arms(args).items():
        spec = dict(spec)
        policy = copy.deepcopy(base)
        if "attn" in spec:
            policy.set_attn_implementation(spec.pop("attn"))
        modules[name] = build_learner(policy, OBJECTIVE, OPTIM, batch_size=args.batch, **spec)
    times: dict[str, list[float]] = {name: [] for name in modules}
    counts: dict[str, float] = {}
    for round_ in range(args.repeats + 1):
        for name, module in modules.items():
            logged = one_update(module, batch, args.device)
            counts[name] = logged["train/micro_batches"]
            if round_:  # round 0 warms up
                times[name].append(logged["timing/step_s"])
        if round_:
            done = ", ".join(f"{n} {t[-1]:.2f}s" for n, t in times.items())
            print(f"round {round_}: {done}", flush=True)
    first = next(iter(times))
    for name, values in times.items():
        med = statistics.median(values)
        ratio = statistics.median(a / b for a, b in zip(times[first], values, strict=True))
        print(
            f"{name:14s} step {med:7.2f} s  learner {real / med:8.0f} tokens/s  "
            f"micro-batches {counts[name]:.0f}  speed-up vs {first} {ratio:.2f}x"
        )
    if args.compare == "layout":
        ratio = statistics.median(
            a / b for a, b in zip(times["padded"], times["packed"], strict=True)
        )
        print(f"packed / padded learner tokens/s: {ratio:.2f}x (target >= 1.8x)")


if __name__ == "__main__":
    sys.exit(main())
