"""GPU figures: the learner's model-FLOPs utilisation with its profile against a plain
transformers step, peak memory against the dry run's memory plan, and the torch engine's
decode throughput (run by scripts/gpu_check.sh; `--device cpu --tiny` runs every part on a
CPU at a tiny shape, which tests/test_gpu_mfu.py does).

1. mfu: one FlashREINFORCE learner update (`FlashReinforceModule.training_step` under a
   Lightning Trainer: packed token-budget micro-batches, chunked log-probs, the objective,
   backward, AdamW) on a random-init model of Qwen2.5-1.5B's shape in bf16, on B trajectories
   with log-normal lengths (median 1,024, clipped to [64, 8,192]), the micro-batch token budget
   `auto` picks on this device (`--budget N` sets one); median of `--repeats` timed
   updates after one warm-up. Then one profiled update (bench/learner_profile.py: seconds per
   phase), and a plain transformers training step of the same shape on the same number of
   tokens in dense 1,024-token rows. FLOPs per update: bench/learner_profile.model_flops (the
   same formula for both; recomputation is not counted). MFU = FLOPs / step time / peak,
   against the H100/H200 SXM datasheet's dense bf16 989 TFLOP/s and a bf16 matmul measured
   here; `frlab/plain per FLOP` = frlab's FLOP/s over the plain step's.
2. memory: `torch.cuda.max_memory_allocated` over an update against the learner line of the
   dry run's memory plan (frlab.model.memory_plan) for the same settings: Qwen2.5-1.5B's shape
   (bf16) at 4 trajectories of 8,192 tokens, one per micro-batch, checkpointing off and on;
   the `python_tool_qwen7b_lora` preset's shape (Qwen2.5-7B in bf16, frozen, rank-32 adapters,
   checkpointing on, bf16-mixed, one 8,192-token trajectory per micro-batch), two of them.
3. decode: the torch engine on Qwen2.5-0.5B's shape in bf16: generated tokens per second.
4. compile: the MFU update with `model.compile=true` (frlab.model.compile): the first update
   (compiling) and the step after, against the uncompiled step of part 1.

Run: `PYTHONPATH=$PWD python bench/gpu_mfu.py [--parts mfu,memory,decode,compile]` (one line
per figure).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import functools
import logging
import os
import statistics
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from learner import OBJECTIVE, OPTIM, QWEN25_05B, TOY, make_batch, one_update  # noqa: E402
from learner_profile import (  # noqa: E402
    describe_profile,
    model_flops,
    plain_step_seconds,
    profile_update,
)

from frlab.build import build_learner
from frlab.config.arguments import declared_arguments  # noqa: E402
from frlab.config.schema import LoraConfig, ModelConfig  # noqa: E402
from frlab.defaults import sampling_params, torch_engine
from frlab.learner.module import FlashReinforceModule  # noqa: E402
from frlab.model.memory_plan import gib, memory_plan  # noqa: E402
from frlab.model.policy import build_policy, tiny_config  # noqa: E402

QWEN25_1P5B = {
    "vocab_size": 151936,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "rope_theta": 1000000.0,
}
QWEN25_7B = {
    "vocab_size": 152064,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "rope_theta": 1000000.0,
}
LORA_7B = {"rank": 32, "alpha": 64.0}  # experiment=python_tool_qwen7b_lora
DATASHEET_BF16_TFLOPS = 989.0
UNCOMPILED: dict[str, float] = {}  # the mfu part's step, for the compile part's ratio


def measured_matmul_tflops(device: str, n: int = 8192, iters: int = 20) -> float:
    if device != "cuda":
        return float("nan")
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


def shape(args: argparse.Namespace, full: dict) -> dict:
    return TOY if args.tiny else full


def build(args: argparse.Namespace, cfg: dict, **kwargs: Any) -> torch.nn.Module:
    """A random-init bf16 model of `cfg`'s shape, built on the device."""
    with torch.device(args.device):
        changes = {"config": tiny_config("qwen2", **cfg), "dtype": args.dtype, **kwargs}
        if changes.get("lora") is None:  # no adapters: the declared default
            changes.pop("lora", None)
        else:
            changes["lora"] = declared_arguments(LoraConfig, **changes["lora"])
        model = build_policy(
            **declared_arguments(ModelConfig, name_or_path=None, **changes), seed=0
        )
    return model.train()


def learner_module(base: torch.nn.Module, batch: int, budget: int) -> FlashReinforceModule:
    return build_learner(
        copy.deepcopy(base),
        OBJECTIVE,
        OPTIM,
        batch_size=batch,
        micro_batch_size=batch,
        pack_sequences=True,
        max_tokens_per_micro_batch=budget,
    )


def mfu_inputs(args: argparse.Namespace) -> tuple[dict, torch.nn.Module, list[int], Any]:
    """(shape, model, lengths, batch) of the MFU update."""
    cfg = shape(args, QWEN25_1P5B)
    base = build(args, cfg)
    hi = cfg["max_position_embeddings"]
    lengths = lognormal_lengths(args.batch, args.median, 0, min(64, hi // 4), min(8192, hi))
    return cfg, base, lengths, make_batch(base, lengths, seed=0)


def timed_steps(module: FlashReinforceModule, batch: Any, args: argparse.Namespace) -> list:
    """Step seconds of `--repeats` updates after one warm-up."""
    return [
        one_update(module, batch, args.device)["timing/step_s"] for _ in range(args.repeats + 1)
    ][1:]


def budget_of(args: argparse.Namespace, cfg: dict, lengths: list[int]) -> int:
    """`--budget` as a number: `auto` is what the learner would choose here (bf16 weights,
    checkpointing off, this device's free memory)."""
    if args.budget != "auto":
        return int(args.budget)
    from frlab.model.auto_memory import device_memory, resolve_learner_memory

    sections = {
        "model": {
            "config": {"model_type": "qwen2", **cfg},
            "dtype": args.dtype,
            "lora": None,
            "gradient_checkpointing": False,
            "logprob_chunk_size": 1024,
        },
        "data": {
            "batch_size": args.batch,
            "micro_batch_size": args.batch,
            "max_tokens_per_micro_batch": "auto",
        },
        "rollout": {"max_len": max(lengths), "max_in_flight": 1, "device": "cpu"},
        "trainer": {
            "precision": "bf16-true" if args.dtype == "bfloat16" else "32-true",
            "devices": 1,
            "accelerator": args.device,
        },
    }
    chosen = resolve_learner_memory(sections, device_memory(args.device))
    assert chosen is not None and chosen.max_tokens_per_micro_batch is not None
    print(f"budget: {chosen.why}", flush=True)
    return int(chosen.max_tokens_per_micro_batch)


def mfu(args: argparse.Namespace, peak_measured: float) -> None:
    cfg, base, lengths, batch = mfu_inputs(args)
    args.budget = budget_of(args, cfg, lengths)
    module = learner_module(base, args.batch, args.budget)
    del base
    step = statistics.median(timed_steps(module, batch, args))
    UNCOMPILED["step"] = step
    tokens = sum(lengths)
    achieved = model_flops(cfg, lengths) / step / 1e12
    print(
        f"mfu: Qwen2.5-1.5B shape {args.dtype}, B={args.batch}, {tokens} tokens (median "
        f"{statistics.median(lengths):g}, max {max(lengths)}), budget {args.budget}: step "
        f"{step:.3f} s, {tokens / step:,.0f} tokens/s, {achieved:.1f} TFLOP/s = "
        f"{achieved / DATASHEET_BF16_TFLOPS:.1%} of {DATASHEET_BF16_TFLOPS:g} (datasheet), "
        f"{achieved / peak_measured:.1%} of {peak_measured:.0f} (measured matmul)",
        flush=True,
    )
    seconds = profile_update(functools.partial(one_update, module, batch, args.device), args.device)
    print(f"profile: {describe_profile(seconds)}", flush=True)
    del module
    _free(args.device)
    width = min(1024, cfg["max_position_embeddings"])
    rows = max(1, round(tokens / width))
    config = tiny_config("qwen2", **cfg)
    plain = plain_step_seconds(config, rows, width, args.device, _dtype(args), args.repeats)
    plain_flops = model_flops(cfg, [width] * rows) / plain / 1e12
    print(
        f"plain transformers step: {rows} rows x {width} tokens (sdpa, full logits + "
        f"cross-entropy, AdamW): {plain:.3f} s, {rows * width / plain:,.0f} tokens/s, "
        f"{plain_flops:.1f} TFLOP/s = {plain_flops / DATASHEET_BF16_TFLOPS:.1%} of "
        f"{DATASHEET_BF16_TFLOPS:g}",
        flush=True,
    )
    print(f"frlab/plain per FLOP: {achieved / plain_flops:.2f}", flush=True)


def compiled(args: argparse.Namespace) -> None:
    """The MFU update with model.compile=true: the first update (compiling), then the step."""
    cfg, base, lengths, batch = mfu_inputs(args)
    module = learner_module(base, args.batch, budget_of(args, cfg, lengths))
    module.settings = dataclasses.replace(module.settings, compile=True)
    module.compile_backend = args.compile_backend
    del base
    start = time.perf_counter()
    one_update(module, batch, args.device)
    first = time.perf_counter() - start
    step = statistics.median(timed_steps(module, batch, args))
    ratio = f"{UNCOMPILED['step'] / step:.2f}x" if "step" in UNCOMPILED else "n/a"
    print(
        f"compile ({args.compile_backend}): first update {first:.1f} s, then step {step:.3f} "
        f"s, {ratio} the uncompiled step's speed; {module.compiled.compiles} graphs compiled "
        f"in all",
        flush=True,
    )
    del module
    _free(args.device)


def planned(
    cfg: dict, *, lora: dict | None, checkpointing: bool, tokens: int, precision: str
) -> int:
    """The learner bytes the dry run's memory plan gives for these settings (one GPU)."""
    lora = None if lora is None else declared_arguments(LoraConfig, **lora)
    plan = memory_plan(
        {
            "model": {
                "config": {"model_type": "qwen2", **cfg},
                "dtype": "bfloat16",
                "lora": lora,
                "gradient_checkpointing": checkpointing,
                "logprob_chunk_size": 1024,
            },
            "data": {"micro_batch_size": 1, "max_tokens_per_micro_batch": tokens},
            "rollout": {"max_len": tokens, "device": "cpu", "max_in_flight": 1},
            "trainer": {"precision": precision, "devices": 1},
        }
    )
    assert plan is not None
    return plan.learner


def measure_peak(args: argparse.Namespace, cfg: dict, rows: int, tokens: int, **kwargs) -> tuple:
    """(peak bytes, step seconds) of one update of `rows` trajectories of `tokens` tokens."""
    base = build(args, cfg, **kwargs)
    batch = make_batch(base, [tokens] * rows, seed=1)
    module = learner_module(base, rows, tokens)
    del base
    _free(args.device)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    logged = one_update(module, batch, args.device)
    peak = torch.cuda.max_memory_allocated() if args.device == "cuda" else 0
    del module, batch
    _free(args.device)
    return peak, logged["timing/step_s"]


def peak_memory(args: argparse.Namespace) -> None:
    tokens = 128 if args.tiny else 8192
    arms = [("Qwen2.5-1.5B shape", shape(args, QWEN25_1P5B), None, ck) for ck in (False, True)]
    arms.append(("python_tool_qwen7b_lora shape", shape(args, QWEN25_7B), LORA_7B, True))
    for name, cfg, lora, ck in arms:
        rows = args.long_rows if lora is None else 2
        peak, step = measure_peak(args, cfg, rows, tokens, gradient_checkpointing=ck, lora=lora)
        plan = planned(cfg, lora=lora, checkpointing=ck, tokens=tokens, precision="bf16-true")
        ratio = f"{plan / peak:.2f}" if peak else "n/a (no CUDA)"
        print(
            f"peak memory: {name}, {rows} trajectories x {tokens} tokens, one per "
            f"micro-batch, checkpointing {'on' if ck else 'off'}"
            f"{', LoRA rank 32' if lora else ''}: measured {gib(peak)}, plan {gib(plan)}, "
            f"plan/measured {ratio} (step {step:.2f} s)",
            flush=True,
        )


def decode(args: argparse.Namespace) -> None:

    cfg = shape(args, QWEN25_05B)
    model = build(args, cfg).eval()
    engine = torch_engine(model, device=args.device, max_batch_size=args.decode_batch, seed=0)
    params = sampling_params(temperature=1.0, max_new_tokens=args.new_tokens)
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(0, cfg["vocab_size"], (16 if args.tiny else 128,), generator=gen).tolist()
        for _ in range(args.decode_batch)
    ]

    async def run() -> int:
        results = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        return sum(len(r.token_ids) for r in results)

    with engine:
        asyncio.run(run())  # warm-up
        _free(args.device)
        start = time.perf_counter()
        tokens = asyncio.run(run())
        _free(args.device)
        wall = time.perf_counter() - start
    print(
        f"decode: torch engine, Qwen2.5-0.5B shape {args.dtype}, {args.decode_batch} "
        f"requests x {args.new_tokens} new tokens: {tokens / wall:,.0f} tokens/s "
        f"({wall:.2f} s)",
        flush=True,
    )


def _dtype(args: argparse.Namespace) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]


def _free(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU check)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--median", type=float, default=1024)
    parser.add_argument(
        "--budget", default="auto", help="tokens per micro-batch, or auto (frlab.model.auto_memory)"
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--long-rows", type=int, default=4)
    parser.add_argument("--decode-batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--parts", default="mfu,memory,decode,compile")
    parser.add_argument("--compile-backend", default="inductor")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_mfu: no CUDA device (--device cpu --tiny runs the parts on a CPU)", file=sys.stderr
        )
        return 1
    logging.getLogger("lightning").setLevel(logging.ERROR)
    peak = measured_matmul_tflops(args.device)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"{name}: bf16 matmul 8192^3 measured {peak:.0f} TFLOP/s", flush=True)
    failed = 0
    for part, fn in (
        ("mfu", lambda: mfu(args, peak)),
        ("memory", lambda: peak_memory(args)),
        ("decode", lambda: decode(args)),
        ("compile", lambda: compiled(args)),
    ):
        if part in args.parts.split(","):
            try:
                fn()
            except Exception as exc:  # report every part even if one fails
                print(f"{part}: FAILED {type(exc).__name__}: {exc}", flush=True)
                failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
