"""GPU check of packed micro-batches: exactness on CUDA, then packed vs padded learner speed.

1. A tiny float32 Qwen2 on CUDA: log-probs, entropies and parameter gradients of a packed
   forward (`sequence_logprobs(pack=True)` inside `packed_attention`) against the padded
   forward, for `sdpa`, `eager` and, when transformers finds the flash-attn package,
   `flash_attention_2` (native varlen). Prints the largest differences; exits 1 above 1e-4.
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

from frlab.model.lm_logprobs import sequence_logprobs  # noqa: E402
from frlab.model.packed_attention import packed_attention  # noqa: E402
from frlab.model.policy import build_policy, tiny_config  # noqa: E402


def exactness(device: str) -> float:
    """Largest |packed - padded| over log-probs, entropies and gradients, per attention."""
    from transformers.utils import is_flash_attn_2_available

    impls = ["sdpa", "eager"]
    if device == "cuda" and is_flash_attn_2_available():
        impls.append("flash_attention_2")
    lengths = [5, 300, 17, 1000, 2, 64]
    width = max(lengths)
    mask = torch.arange(width)[None] < torch.tensor(lengths)[:, None]
    gen = torch.Generator().manual_seed(0)
    ids = torch.where(mask, torch.randint(0, 256, mask.shape, generator=gen), 0)
    action = mask.clone()
    action[:, 0] = False
    ids, mask, action = ids.to(device), mask.to(device), action.to(device)
    worst = 0.0
    for impl in impls:
        dtype = "bfloat16" if impl.startswith("flash") else "float32"
        config = tiny_config("qwen2", vocab_size=256, max_position_embeddings=2048)
        model = build_policy(config=config, seed=0, attn_implementation=impl, dtype=dtype)
        model = model.to(device)
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
        print(f"{impl:18s} {dtype:8s} max |packed - padded|: log-probs {diff_lp:.2e}, "
              f"entropies {diff_ent:.2e}, gradients {diff_g:.2e}")  # fmt: skip
        if dtype == "float32":
            worst = max(worst, diff_lp, diff_ent, diff_g)
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
    print(f"float32 worst difference {worst:.2e} ({'ok' if worst <= 1e-4 else 'FAIL'})")
    if args.device == "cuda":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
        from learner import main as bench_learner

        bench_learner([
            "--device", "cuda", "--dtype", "bfloat16", "--model", "qwen2.5-0.5b",
            "--batch", "32", "--median", "1024", "--max-len", "8192", "--min-len", "64",
            "--budget", "16384", "--micro", "4", "--repeats", str(args.repeats),
        ])  # fmt: skip
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
