"""GPU figures: learner model-FLOPs utilisation, peak memory at 8,192-token trajectories, and the
torch engine's decode throughput (needs CUDA; run by scripts/gpu_check.sh).

1. MFU: one FlashREINFORCE learner update (`FlashReinforceModule.training_step` under a
   Lightning Trainer: packed token-budget micro-batches, chunked log-probs, the objective,
   backward, AdamW) on a random-init model of Qwen2.5-1.5B's shape in bf16, on B trajectories
   with log-normal lengths (median 1,024, clipped to [64, 8,192]). Model FLOPs per update =
   3 x forward FLOPs (backward = 2 x forward), forward = 2 x (non-embedding matmul parameters
   + the LM head) per token + causal attention 2 x n^2 x hidden per layer per trajectory of n
   tokens (recomputation is not counted). MFU = model FLOPs / step time / peak, against the
   H100/H200 SXM datasheet's dense bf16 989 TFLOP/s and against a bf16 matmul measured here.
2. Peak memory: `torch.cuda.max_memory_allocated` over an update whose trajectories all have
   8,192 tokens (one per micro-batch), without and with gradient checkpointing.
3. Decode: the torch engine (frlab.rollout.engines.torch) on Qwen2.5-0.5B's shape in bf16:
   generated tokens per second for a batch of requests sampled at temperature 1.

Run: `PYTHONPATH=$PWD python bench/gpu_mfu.py` (prints one line per figure).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import logging
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from learner import OBJECTIVE, OPTIM, QWEN25_05B, make_batch, one_update  # noqa: E402

from frlab.learner.module import FlashReinforceModule  # noqa: E402
from frlab.model.policy import build_policy, tiny_config  # noqa: E402

QWEN25_1P5B = {"vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960,
               "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
               "max_position_embeddings": 32768, "tie_word_embeddings": True,
               "rope_theta": 1000000.0}  # fmt: skip
DATASHEET_BF16_TFLOPS = 989.0


def matmul_params(cfg: dict) -> int:
    """Parameters that take part in matmuls per token: attention, MLP and the LM head."""
    d, ff, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    head_dim = d // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * head_dim
    per_layer = d * d + 2 * d * kv + d * d + 3 * d * ff
    return layers * per_layer + d * cfg["vocab_size"]


def update_flops(cfg: dict, lengths: list[int]) -> float:
    """Model FLOPs of one training update (forward + backward = 3 x forward)."""
    tokens = sum(lengths)
    forward = 2 * matmul_params(cfg) * tokens
    forward += cfg["num_hidden_layers"] * sum(2 * n * n * cfg["hidden_size"] for n in lengths)
    return 3.0 * forward


def measured_matmul_tflops(n: int = 8192, iters: int = 20) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * iters / (time.perf_counter() - start) / 1e12


def lognormal_lengths(batch: int, median: float, seed: int, lo: int, hi: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    raw = (torch.randn(batch, generator=gen) + torch.log(torch.tensor(median))).exp()
    return raw.round().clamp(lo, hi).long().tolist()


def learner_module(base: torch.nn.Module, batch: int, budget: int) -> FlashReinforceModule:
    return FlashReinforceModule(
        {}, OBJECTIVE, OPTIM, batch_size=batch, policy=copy.deepcopy(base),
        micro_batch_size=batch, pack_sequences=True, max_tokens_per_micro_batch=budget,
    )  # fmt: skip


def mfu(args: argparse.Namespace, peak_measured: float) -> None:
    cfg = QWEN25_1P5B
    base = build_policy(config=tiny_config("qwen2", **cfg), seed=0, dtype="bfloat16")
    base = base.to("cuda").train()
    lengths = lognormal_lengths(args.batch, args.median, 0, 64, 8192)
    batch = make_batch(base, lengths, seed=0)
    module = learner_module(base, args.batch, args.budget)
    del base
    times = []
    for round_ in range(args.repeats + 1):
        logged = one_update(module, batch, "cuda")
        if round_:
            times.append(logged["timing/step_s"])
    step = statistics.median(times)
    achieved = update_flops(cfg, lengths) / step / 1e12
    print(f"mfu: Qwen2.5-1.5B shape bf16, B={args.batch}, {sum(lengths)} tokens (median "
          f"{statistics.median(lengths):g}, max {max(lengths)}), budget {args.budget}: step "
          f"{step:.3f} s, {sum(lengths) / step:,.0f} tokens/s, {achieved:.0f} TFLOP/s = "
          f"{achieved / DATASHEET_BF16_TFLOPS:.1%} of {DATASHEET_BF16_TFLOPS:g} (datasheet), "
          f"{achieved / peak_measured:.1%} of {peak_measured:.0f} (measured matmul)")  # fmt: skip
    del module
    torch.cuda.empty_cache()


def peak_memory(args: argparse.Namespace) -> None:
    for checkpointing in (False, True):
        base = build_policy(config=tiny_config("qwen2", **QWEN25_1P5B), seed=0, dtype="bfloat16",
                            gradient_checkpointing=checkpointing).to("cuda").train()  # fmt: skip
        lengths = [8192] * args.long_rows
        batch = make_batch(base, lengths, seed=1)
        module = learner_module(base, args.long_rows, 8192)
        del base
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        logged = one_update(module, batch, "cuda")
        peak = torch.cuda.max_memory_allocated() / 2**30
        print(f"peak memory: {args.long_rows} trajectories x 8192 tokens, one per micro-batch, "
              f"gradient checkpointing {'on' if checkpointing else 'off'}: {peak:.1f} GiB "
              f"(step {logged['timing/step_s']:.2f} s)")  # fmt: skip
        del module, batch
        torch.cuda.empty_cache()


def decode(args: argparse.Namespace) -> None:
    from frlab.rollout.engine import SamplingParams
    from frlab.rollout.engines.torch import TorchEngine

    model = build_policy(config=tiny_config("qwen2", **QWEN25_05B), seed=0, dtype="bfloat16")
    engine = TorchEngine(model, device="cuda", max_batch_size=args.decode_batch, seed=0)
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 151936, (128,), generator=gen).tolist()
               for _ in range(args.decode_batch)]  # fmt: skip

    async def run() -> int:
        results = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        return sum(len(r.token_ids) for r in results)

    with engine:
        asyncio.run(run())  # warm-up
        torch.cuda.synchronize()
        start = time.perf_counter()
        tokens = asyncio.run(run())
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    print(f"decode: torch engine, Qwen2.5-0.5B shape bf16, {args.decode_batch} requests x "
          f"{args.new_tokens} new tokens (prompts 128): {tokens / wall:,.0f} tokens/s "
          f"({wall:.2f} s)")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--median", type=float, default=1024)
    parser.add_argument("--budget", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--long-rows", type=int, default=4)
    parser.add_argument("--decode-batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--parts", default="mfu,memory,decode")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_mfu: no CUDA device", file=sys.stderr)
        return 1
    logging.getLogger("lightning").setLevel(logging.ERROR)
    peak = measured_matmul_tflops()
    print(f"{torch.cuda.get_device_name()}: bf16 matmul 8192^3 measured {peak:.0f} TFLOP/s")
    parts = args.parts.split(",")
    for name, fn in (("mfu", lambda: mfu(args, peak)), ("memory", lambda: peak_memory(args)),
                     ("decode", lambda: decode(args))):  # fmt: skip
        if name in parts:
            try:
                fn()
            except Exception as exc:  # report every part even if one fails
                print(f"{name}: FAILED {type(exc).__name__}: {exc}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
