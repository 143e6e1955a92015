"""GPU check of packed micro-batches: exactness on CUDA, then packed vs padded learner speed.

1. A tiny Qwen2 on CUDA: log-probs, entropies and parameter gradients of a packed forward
   (`sequence_logprobs(pack=True)` inside `packed_attention`) against the padded forward, for
   `sdpa` and `eager` in float32 (packed: sdpa per trajectory), `sdpa` in bfloat16 (packed:
   one varlen call per layer) and, when transformers finds the flash-attn package,
   `flash_attention_2` (native varlen). Prints the largest differences; exits 1 above 1e-4 in
   float32 or 0.05 in bfloat16 (gradients relative to the largest).
2. `bench/learner.py --device cuda --dtype bfloat16 --model qwen2.5-0.5b`: one learner update
   (Lightning Trainer + FlashReinforceModule) on B=32 log-normal trajectories (median 1024,
   max 8192 tokens), packed with a 16,384-token budget vs padded micro-batches of 4 rows.

Needs torch with CUDA, lightning and transformers (no hydra). From the repo root:
    PYTHONPATH=$PWD python scripts/gpu_packing_check.py 2>&1 | tee $OUT/gpu_packing.log
Sized for about 3 minutes on one H200 (`--repeats 1` for less); `--device cpu` runs part 1 on
a CPU (what tests/model/test_packed_attention.py checks in float64).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from frlab.config.arguments import declared_arguments
from frlab.config.schema import ModelConfig
from frlab.model.lm_logprobs import sequence_logprobs  # noqa: E402
from frlab.model.packed_attention import packed_attention  # noqa: E402
from frlab.model.policy import build_policy, tiny_config  # noqa: E402

BF16_TOLERANCE = 0.05  # bf16 log-probs, and gradients relative to the largest


def exactness(device: str) -> dict[str, float]:
    """Largest |packed - padded| over log-probs, entropies and gradients, per attention and
    dtype: {dtype: worst}. The packed kernel is the one `packed_kernel` picks (float32: sdpa
    per trajectory; bfloat16 on a GPU sm80+: one varlen call per layer)."""
    from transformers.utils import is_flash_attn_2_available

    from frlab.model.packed_attention import packed_kernel

    arms = [("sdpa", "float32"), ("eager", "float32"), ("sdpa", "bfloat16")]
    if device == "cuda" and is_flash_attn_2_available():
        arms.append(("flash_attention_2", "bfloat16"))
    lengths = [5, 300, 17, 1000, 2, 64]
    width = max(lengths)
    mask = torch.arange(width)[None] < torch.tensor(lengths)[:, None]
    gen = torch.Generator().manual_seed(0)
    ids = torch.where(mask, torch.randint(0, 256, mask.shape, generator=gen), 0)
    action = mask.clone()
    action[:, 0] = False
    ids, mask, action = ids.to(device), mask.to(device), action.to(device)
    worst: dict[str, float] = {}
    for impl, dtype in arms:
        config = tiny_config("qwen2", vocab_size=256, max_position_embeddings=2048)
        model = build_policy(
            **declared_arguments(
                ModelConfig, name_or_path=None, config=config, attn_implementation=impl, dtype=dtype
            ),
            seed=0,
        )
        model = model.to(device)
        kernel = packed_kernel(model)[0] if impl in ("sdpa", "eager") else "native"
        results = []
        for pack in (False, True):
            model.zero_grad(set_to_none=True)
            with packed_attention(model) if pack else torch.enable_grad():
                lp, ent = sequence_logprobs(
                    model, ids, mask, action_mask=action, compute_entropy=True, pack=pack
                )
                lp.sum().backward()
            grads = [p.grad.float() for p in model.parameters() if p.grad is not None]
            results.append((lp.detach(), ent, grads))
        (lp0, e0, g0), (lp1, e1, g1) = results
        diff_lp = float((lp0 - lp1).abs().max())
        diff_ent = float((e0 - e1).abs().max())
        diff_g = max(float((a - b).abs().max()) for a, b in zip(g0, g1, strict=True))
        scale = max(float(b.abs().max()) for b in g0) or 1.0
        print(
            f"{impl:18s} {dtype:8s} packed kernel {kernel:6s} max |packed - padded|: "
            f"log-probs {diff_lp:.2e}, entropies {diff_ent:.2e}, gradients {diff_g:.2e} "
            f"({diff_g / scale:.2e} of the largest)"
        )
        grads = diff_g if dtype == "float32" else diff_g / scale  # bf16: relative
        worst[dtype] = max(worst.get(dtype, 0.0), diff_lp, diff_ent, grads)
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_packing_check: no CUDA device", file=sys.stderr)
        return 1
    worst = exactness(args.device)
    ok = worst["float32"] <= 1e-4 and worst["bfloat16"] <= BF16_TOLERANCE
    print(
        f"worst difference: float32 {worst['float32']:.2e} (<= 1e-4), bfloat16 "
        f"{worst['bfloat16']:.2e} (<= {BF16_TOLERANCE:g}) ({'ok' if ok else 'FAIL'})"
    )
    if args.device == "cuda":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
        from learner import main as bench_learner

        bench_learner(
            [
                "--device",
                "cuda",
                "--dtype",
                "bfloat16",
                "--model",
                "qwen2.5-0.5b",
                "--batch",
                "32",
                "--median",
                "1024",
                "--max-len",
                "8192",
                "--min-len",
                "64",
                "--budget",
                "16384",
                "--micro",
                "4",
                "--repeats",
                str(args.repeats),
            ]
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
