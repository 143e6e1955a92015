"""Benchmark the FlashREINFORCE objective and the chunked log-prob helper.

Speed: forward+backward time of `frlab.objective.flashreinforce_loss` at B=128, T=4096 (fp32,
2 threads), with q = negative_token_fraction = 1 and 0.9, against
  (a) a reference-style implementation written here: validation by boolean indexing (several
      host syncs), a Python loop over failed rows for the entropy filter;
  (b) the bare vectorised formula with no validation, no overflow check and no diagnostics
      (its entropy filter uses the same vectorised top-entropy selection as frlab, so the
      ratio isolates what validation and composition cost).
All variants run in the same process, interleaved round by round; medians after warm-up.
Targets: frlab no slower than (a) in either mode, at most 1.3x of (b).

Memory: peak extra resident memory of `sampled_logprobs_and_entropy` versus the naive
`torch.log_softmax(logits.float(), -1)` + gather + entropy at V = 151,936, each variant in a
fresh subprocess, measured as the growth of ru_maxrss after the logits exist. Target: helper
peak extra <= 25% of the logits' size.

Run: `python bench/objective.py` (full) or `python bench/objective.py --quick` (tiny sizes).
On a shared machine wall-clock medians are noisy: process CPU time and the median of per-round
(paired) ratios are printed alongside; `--threads 1` removes thread-scheduling noise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
from torch import Tensor

from frlab.objective import flashreinforce_loss, sampled_logprobs_and_entropy
from frlab.objective.token_filters import top_entropy_tokens

EPS = 1e-6
VOCAB = 151_936


# --------------------------------------------------------------------------- inputs


def make_inputs(b: int, t: int, seed: int = 0, masked_nan: bool = False) -> dict[str, Tensor]:
    """Right-padded rows: a prompt prefix (mask False), policy tokens, padding; small drift.

    Masked log-probs are finite (what a model gives at prompt/padding positions) and masked
    behaviour log-probs are 0 (the collate convention), unless `masked_nan` puts NaN there.
    """
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(t // 4, t + 1, (b,), generator=g)
    prompt = torch.randint(1, max(2, t // 8), (b,), generator=g)
    pos = torch.arange(t)
    mask = (pos >= prompt[:, None]) & (pos < lengths[:, None])
    behavior = -torch.rand(b, t, generator=g).pow(3) * 6.0
    current = (behavior + 0.02 * torch.randn(b, t, generator=g)).clamp_max(0.0)
    return {
        "log_probs": torch.where(mask, current, float("nan")) if masked_nan else current,
        "behavior_log_probs": torch.where(mask, behavior, float("nan") if masked_nan else 0.0),
        "rewards": torch.randint(0, 2, (b,), generator=g).float(),
        "action_mask": mask,
        "entropies": torch.rand(b, t, generator=g) * 3.0,
        "failures": torch.rand(b, generator=g) < 0.5,
    }


# --------------------------------------------------------------------------- (a) reference style


def _check_active(x: Tensor, mask: Tensor, name: str) -> None:
    active = x.detach()[mask]
    if not torch.isfinite(active).all():
        raise ValueError(f"{name} has non-finite values on policy tokens")
    if (active > 0).any():
        raise ValueError(f"{name} has positive values on policy tokens")


def reference_style_loss(lp, bh, rewards, mask, *, delta, q, entropies, failures) -> Tensor:  # noqa: ANN001
    """The FlashREINFORCE loss written plainly: boolean-indexing validation, per-row loop for
    the entropy filter."""
    if lp.dim() != 2 or lp.numel() == 0:
        raise ValueError("log_probs must be a non-empty 2-D tensor")
    if bh.shape != lp.shape or mask.shape != lp.shape or rewards.shape != lp.shape[:1]:
        raise ValueError("shape mismatch")
    if mask.dtype != torch.bool or not lp.is_floating_point() or not bh.is_floating_point():
        raise ValueError("bad dtype")
    if math.isnan(delta) or delta < 0 or not 0.0 <= q <= 1.0:
        raise ValueError("bad delta or fraction")
    if (mask.sum(dim=1) == 0).any():
        raise ValueError("row without policy tokens")
    if not torch.isfinite(rewards).all():
        raise ValueError("non-finite rewards")
    _check_active(lp, mask, "log_probs")
    _check_active(bh, mask, "behavior_log_probs")
    if q < 1.0 and not torch.isfinite(entropies[mask]).all():
        raise ValueError("non-finite entropies")
    dtype = torch.float64 if lp.dtype == torch.float64 else torch.float32
    lpc, bhc, r = lp.to(dtype), bh.to(dtype), rewards.to(dtype)
    adv = r - r.mean()
    t_i = mask.sum(dim=1).to(dtype)
    cur = lpc.detach()
    rho = torch.exp(torch.where(mask, cur - bhc, 0.0))
    p = torch.exp(bhc).clamp(EPS, 1 - EPS)
    qq = torch.exp(cur).clamp(EPS, 1 - EPS)
    d = p * (torch.log(p) - torch.log(qq)) + (1 - p) * (torch.log(1 - p) - torch.log(1 - qq))
    kl = (torch.where(mask, d, 0.0).sum(dim=1) / t_i).clamp_min(0.0)
    admitted = kl <= delta
    keep = mask.clone()
    if q < 1.0:
        for i in failures.nonzero().flatten().tolist():
            idx = mask[i].nonzero().flatten()
            k = math.ceil(q * idx.numel())
            order = torch.sort(entropies[i, idx], descending=True, stable=True).indices[:k]
            row = torch.zeros_like(keep[i])
            row[idx[order]] = True
            keep[i] = row
    active = keep & admitted[:, None]
    if not torch.isfinite(rho[active]).all():
        raise FloatingPointError("ratio overflow")
    term = -(torch.where(active, rho, 0.0) * adv[:, None]) * torch.where(mask, lpc, 0.0)
    return (torch.where(active, term, 0.0).sum(dim=1) / t_i).sum() / lp.shape[0]


# --------------------------------------------------------------------------- (b) bare


def bare_loss(lp, bh, rewards, mask, *, delta, q, entropies, failures) -> Tensor:  # noqa: ANN001
    """The same maths, vectorised, with no validation, no overflow check, no diagnostics."""
    adv = rewards - rewards.mean()
    t_i = mask.sum(dim=1)
    cur = lp.detach()
    rho = torch.exp(torch.where(mask, cur - bh, 0.0))
    p = torch.exp(bh).clamp(EPS, 1 - EPS)
    qq = torch.exp(cur).clamp(EPS, 1 - EPS)
    d = p * (torch.log(p) - torch.log(qq)) + (1 - p) * (torch.log(1 - p) - torch.log(1 - qq))
    admitted = (torch.where(mask, d, 0.0).sum(dim=1) / t_i).clamp_min(0.0) <= delta
    keep = mask
    if q < 1.0:  # the same vectorised top-entropy selection as frlab, on the failed rows
        rows = failures.nonzero().squeeze(1)
        keep = mask.clone()
        keep[rows] = top_entropy_tokens(mask[rows], entropies[rows], q)
    w = torch.where(keep & admitted[:, None], rho, 0.0)
    term = (w * -adv[:, None]) * torch.where(mask, lp, 0.0)
    return (term.sum(dim=1) / t_i).sum() / lp.shape[0]


# --------------------------------------------------------------------------- speed


def _frlab(lp, bh, rewards, mask, *, delta, q, entropies, failures) -> Tensor:  # noqa: ANN001
    loss, _ = flashreinforce_loss(
        lp,
        bh,
        rewards,
        mask,
        delta=delta,
        negative_token_fraction=q,
        entropies=entropies if q < 1 else None,
        failures=failures if q < 1 else None,
    )
    return loss


NAN_VARIANT = "frlab, NaN masked"  # frlab on inputs with NaN in every masked slot
VARIANTS: dict[str, Callable[..., Tensor]] = {
    NAN_VARIANT: _frlab,
    "frlab": _frlab,
    "(a) reference-style": reference_style_loss,
    "(b) bare": bare_loss,
}


def _call(
    fn: Callable[..., Tensor], x: dict[str, Tensor], lp: Tensor, q: float, delta: float
) -> Tensor:
    args = (lp, x["behavior_log_probs"], x["rewards"], x["action_mask"])
    return fn(*args, delta=delta, q=q, entropies=x["entropies"], failures=x["failures"])


def _one(
    fn: Callable[..., Tensor], x: dict[str, Tensor], q: float, delta: float
) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one forward+backward."""
    lp = x["log_probs"].clone().requires_grad_(True)
    wall, cpu = time.perf_counter(), time.process_time()
    loss = _call(fn, x, lp, q, delta)
    loss.backward()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if not (math.isfinite(loss.item()) and torch.isfinite(lp.grad).all()):
        raise RuntimeError(f"{fn.__name__}: non-finite loss or gradient")
    return wall, cpu


def check_agreement(
    x: dict[str, Tensor], x_nan: dict[str, Tensor], q: float, delta: float
) -> float:
    """Max |loss difference| between all variants (they must compute the same thing; NaN in
    masked slots must change nothing)."""
    losses = [
        _call(fn, xs, xs["log_probs"].clone().requires_grad_(True), q, delta).item()
        for name, fn in VARIANTS.items()
        for xs in [x_nan if name == NAN_VARIANT else x]
    ]
    return max(abs(v - losses[0]) for v in losses)


def _verdict(ratio: float, target: float) -> str:
    return f"{ratio:.3f} ({'PASS' if ratio <= target else 'FAIL'} <= {target})"


def speed(b: int, t: int, repeats: int, warmup: int, delta: float) -> None:
    x, x_nan = make_inputs(b, t), make_inputs(b, t, masked_nan=True)
    print(
        f"\n## forward+backward, B={b}, T={t}, fp32, threads={torch.get_num_threads()}, "
        f"policy tokens={int(x['action_mask'].sum())}, median of {repeats} interleaved rounds "
        f"(after {warmup} warm-up); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(
        f"{'mode':<8}{'variant':<22}{'wall med ms':>12}{'wall min ms':>12}{'cpu med ms':>11}"
        f"{'frlab/this wall':>16}{'frlab/this cpu':>15}"
    )
    for q in (1.0, 0.9):
        diff = check_agreement(x, x_nan, q, delta)
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
        for rnd in range(warmup + repeats):
            for name, fn in VARIANTS.items():  # interleaved: shared-CPU noise hits all alike
                measured = _one(fn, x_nan if name == NAN_VARIANT else x, q, delta)
                if rnd >= warmup:
                    runs[name].append(measured)
        wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
        cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
        for name, v in runs.items():
            print(
                f"q={q:<6}{name:<22}{wall[name] * 1e3:>12.2f}{min(w for w, _ in v) * 1e3:>12.2f}"
                f"{cpu[name] * 1e3:>11.2f}{wall['frlab'] / wall[name]:>16.3f}"
                f"{cpu['frlab'] / cpu[name]:>15.3f}"
            )
        for ref, target in (("(a) reference-style", 1.0), ("(b) bare", 1.3)):
            print(
                f"  q={q}: frlab/{ref[:3]} wall {_verdict(wall['frlab'] / wall[ref], target)}, "
                f"cpu {_verdict(cpu['frlab'] / cpu[ref], target)}, paired wall "
                f"{_verdict(_paired(runs, 'frlab', ref), target)}; NaN-masked inputs wall "
                f"{_paired(runs, NAN_VARIANT, ref):.3f} (paired)"
            )
        print(f"  q={q}: max |loss difference| between variants = {diff:.2e}")


def _paired(runs: dict[str, list[tuple[float, float]]], a: str, b: str) -> float:
    """Median over rounds of wall(a) / wall(b) measured in the same round (drift cancels)."""
    return statistics.median(x[0] / y[0] for x, y in zip(runs[a], runs[b], strict=True))


# --------------------------------------------------------------------------- memory


def _maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def memory_child(variant: str, n: int, v: int, dtype_name: str, chunk: int) -> None:
    """Runs in a fresh process: print the peak extra RSS of one forward with grad enabled."""
    torch.set_num_threads(2)
    torch.manual_seed(0)
    dtype = getattr(torch, dtype_name)
    logits = torch.randn(n, v, dtype=dtype).requires_grad_(True)
    targets = torch.randint(0, v, (n,))

    def forward(z: Tensor) -> tuple[Tensor, Tensor]:
        if variant == "helper":
            logp, ent = sampled_logprobs_and_entropy(z, targets[: z.shape[0]], chunk_size=chunk)
            return logp, ent
        log_softmax = torch.log_softmax(z.float(), dim=-1)
        logp = log_softmax.gather(1, targets[: z.shape[0], None]).squeeze(1)
        with torch.no_grad():
            ent = -(log_softmax.exp() * log_softmax).sum(dim=-1)
        return logp, ent

    forward(logits[:2])  # warm-up: thread pools and kernels initialise outside the measurement
    base = _maxrss_bytes()
    logp, ent = forward(logits)
    extra = _maxrss_bytes() - base
    print(
        json.dumps(
            {
                "extra": extra,
                "logits": logits.numel() * logits.element_size(),
                "logp0": float(logp[0]),
                "ent0": float(ent[0]),
            }
        )
    )


def _spawn(variant: str, n: int, v: int, dtype: str, chunk: int) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--memory-child", variant, str(n), str(v), dtype, str(chunk)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def memory(v: int, target_mb: float, chunk: int) -> None:
    print(f"\n## peak extra memory of one forward (grad enabled), V={v}, helper chunk_size={chunk}")
    print(
        f"{'dtype':<10}{'N':>6}{'logits MB':>11}{'naive MB':>10}{'helper MB':>11}"
        f"{'naive %':>9}{'helper %':>10}{'helper/naive':>14}"
    )
    for dtype, size in (("float32", 4), ("bfloat16", 2)):
        n = max(1, int(target_mb * 2**20 / (v * size)))
        naive, helper = _spawn("naive", n, v, dtype, chunk), _spawn("helper", n, v, dtype, chunk)
        if (
            abs(naive["logp0"] - helper["logp0"]) > 1e-3
            or abs(naive["ent0"] - helper["ent0"]) > 1e-3
        ):
            raise RuntimeError(f"helper and naive disagree: {naive} vs {helper}")
        mb, size_mb = 2.0**20, naive["logits"] / 2.0**20
        ok = "PASS" if helper["extra"] <= 0.25 * naive["logits"] else "FAIL"
        print(
            f"{dtype:<10}{n:>6}{size_mb:>11.1f}{naive['extra'] / mb:>10.1f}"
            f"{helper['extra'] / mb:>11.1f}"
            f"{100 * naive['extra'] / naive['logits']:>8.1f}%"
            f"{100 * helper['extra'] / helper['logits']:>9.1f}%"
            f"{helper['extra'] / max(naive['extra'], 1):>14.3f}  target helper <= 25%: {ok}"
        )


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke run)")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--chunk-size", type=int, default=16, help="helper rows per chunk")
    parser.add_argument("--memory-child", nargs=5, metavar=("VARIANT", "N", "V", "DTYPE", "CHUNK"))
    args = parser.parse_args(argv)
    if args.memory_child:
        variant, n, v, dtype, chunk = args.memory_child
        memory_child(variant, int(n), int(v), dtype, int(chunk))
        return
    torch.set_num_threads(args.threads)
    if not args.skip_speed:
        b, t = (8, 256) if args.quick else (128, 4096)
        speed(
            b,
            t,
            repeats=3 if args.quick else args.repeats,
            warmup=1 if args.quick else 3,
            delta=3e-3,
        )
    if not args.skip_memory:
        memory(
            VOCAB, target_mb=20 if args.quick else 450, chunk=2 if args.quick else args.chunk_size
        )


if __name__ == "__main__":
    main()
