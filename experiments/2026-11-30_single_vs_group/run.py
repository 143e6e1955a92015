"""Launch the single-vs-group study's runs: one rollout per prompt (FlashREINFORCE) vs GRPO groups
of 4, at equal rollout budgets; its tables and plots come from `python -m frlab.report`.

Every arm uses the same toy preset (`experiment=toy_cpu` or `toy_multi_cpu`), the same B = 64
trajectories per optimizer step and the same 200 steps, so the same rollout budget (12,800
rollouts). They differ in how those rollouts are spent:

- `single`: the preset as shipped: `objective=flashreinforce` (batch-mean baseline, Sequence
  Trust Region, sample-mean aggregation; FlashREINFORCE paper), asynchronous collection, G = 1,
  so 64 distinct prompts per step.
- `grpo4`: `objective=grpo rollout.mode=sync rollout.samples_per_prompt=4` (group-normalised
  advantages, PPO clip; Shao et al., 2024), synchronous collection, 16 prompts x 4 per step.
- `grpo4_async`: GRPO as the FlashREINFORCE paper ran it: group-mean advantages without std
  whitening, PPO clip 0.2 / 0.2, token-mean reduction, 16 prompts x 4 per step, in the same
  asynchronous pipeline as `single` (groups admitted together, whole groups per batch, the
  preset's lag bound).

Each run also records the machine's load average (/proc/loadavg) before and after it, into
`load.json` in its folder; wall times are only compared within one batch of runs.

Usage (from the repository root; runs are sequential, folders under --root, default /tmp/svg):

    python experiments/2026-11-30_single_vs_group/run.py            # every run, then the report
    python experiments/2026-11-30_single_vs_group/run.py --print    # only print the commands

which ends by writing the report (tables and plots) into this folder's `report/`; at any
time, on the runs made so far:

    python -m frlab.report ROOT --threshold train/reward_mean=0.8 --smooth 10 \\
        --out experiments/2026-11-30_single_vs_group/report

A run whose folder already holds summary.json is skipped (delete it to redo).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TASKS = {"single_turn": "toy_cpu", "multi_turn": "toy_multi_cpu"}
ARMS = {
    "single": [],
    "grpo4": ["objective=grpo", "rollout.mode=sync", "rollout.samples_per_prompt=4"],
    "grpo4_async": [
        "objective.baseline=group_mean",
        "objective.trust_region=ppo_clip",
        "objective.aggregation=token_mean",
        "objective.token_filter=none",
        "objective.ppo_clip.eps_low=0.2",
        "objective.ppo_clip.eps_high=0.2",
        "rollout.samples_per_prompt=4",
    ],
}
SEEDS = tuple(range(8))
# Pinned: the presets' own max_steps may change (toy_cpu went from 200 to 300 during this study).
UPDATES = 200
REPORT = ["--threshold", "train/reward_mean=0.8", "--smooth", "10"]  # updates to a 0.8 mean


def run_dir(root: Path, task: str, arm: str, seed: int) -> Path:
    return root / f"{task}__{arm}__s{seed}"


def command(root: Path, task: str, arm: str, seed: int) -> list[str]:
    """The exact `python -m frlab` command line of one run."""
    return [
        sys.executable,
        "-m",
        "frlab",
        f"experiment={TASKS[task]}",
        *ARMS[arm],
        f"seed={seed}",
        f"trainer.max_steps={UPDATES}",
        f"hydra.run.dir={run_dir(root, task, arm, seed)}",
    ]


def run_all(root: Path, tasks: list[str], seeds: list[int], dry: bool) -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    for task in tasks:
        for seed in seeds:
            for arm in ARMS:
                cmd = command(root, task, arm, seed)
                print(shlex.join(cmd), flush=True)
                if dry or (run_dir(root, task, arm, seed) / "summary.json").exists():
                    continue
                t0, load0 = time.monotonic(), loadavg()
                subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
                load = {"before": load0, "after": loadavg(), "run_s": time.monotonic() - t0}
                (run_dir(root, task, arm, seed) / "load.json").write_text(json.dumps(load))
                print(
                    f"  done in {load['run_s']:.0f} s, load {load0} -> {load['after']}", flush=True
                )


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages of the machine."""
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path("/tmp/svg"))
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    ap.add_argument("--print", action="store_true", help="print the commands, run nothing")
    args = ap.parse_args()
    run_all(args.root, args.tasks, args.seeds, args.print)
    out = ["--out", str(HERE / "report")]
    report = [sys.executable, "-m", "frlab.report", str(args.root), *REPORT, *out]
    print(shlex.join(report), flush=True)
    if not args.print:
        subprocess.run(report, cwd=REPO, check=True)


if __name__ == "__main__":
    main()
