"""Reproduce the single-vs-group study: one rollout per prompt (FlashREINFORCE) vs GRPO groups of 4.

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

    python experiments/2026-11-30_single_vs_group/run.py            # every run, then the table
    python experiments/2026-11-30_single_vs_group/run.py --print    # only print the commands
    python experiments/2026-11-30_single_vs_group/run.py --table    # only the table + plots

A run whose folder already holds summary.json is skipped (delete it to redo).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
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
        "objective.baseline=group_mean", "objective.trust_region=ppo_clip",
        "objective.aggregation=token_mean", "objective.token_filter=none",
        "objective.ppo_clip.eps_low=0.2", "objective.ppo_clip.eps_high=0.2",
        "rollout.samples_per_prompt=4",
    ],
}  # fmt: skip
G = {"single": 1, "grpo4": 4, "grpo4_async": 4}
SEEDS = tuple(range(8))
TARGET, WINDOW = 0.8, 10
# Pinned: the presets' own max_steps may change (toy_cpu went from 200 to 300 during this study).
UPDATES = 200


def run_dir(root: Path, task: str, arm: str, seed: int) -> Path:
    return root / f"{task}__{arm}__s{seed}"


def command(root: Path, task: str, arm: str, seed: int) -> list[str]:
    """The exact `python -m frlab` command line of one run."""
    return [
        sys.executable, "-m", "frlab", f"experiment={TASKS[task]}", *ARMS[arm], f"seed={seed}",
        f"trainer.max_steps={UPDATES}",
        f"hydra.run.dir={run_dir(root, task, arm, seed)}",
    ]  # fmt: skip


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
                print(f"  done in {load['run_s']:.0f} s, load {load0} -> {load['after']}",
                      flush=True)  # fmt: skip


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages of the machine."""
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def steps_to_target(rewards: list[float]) -> int | None:
    """First step at which the trailing WINDOW-update mean reward reaches TARGET."""
    for i in range(WINDOW - 1, len(rewards)):
        if sum(rewards[i - WINDOW + 1 : i + 1]) / WINDOW >= TARGET:
            return i + 1
    return None


def measure(path: Path, g: int) -> dict[str, float | int | None]:
    """Numbers of one run, read from its metrics.csv and summary.json."""
    with open(path / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/reward_mean", "") != ""]
    rewards = [float(r["train/reward_mean"]) for r in rows]
    summary = json.loads((path / "summary.json").read_text())
    stats = summary.get("rollout_stats", {})
    load_file = path / "load.json"
    load = json.loads(load_file.read_text()) if load_file.exists() else {}
    consumed = stats.get("consumed", math.nan)
    return {
        "steps": len(rewards),
        "first10": sum(rewards[:10]) / 10,
        "last20": sum(rewards[-20:]) / 20,
        "to_0.8": steps_to_target(rewards),
        "wall_s": float(summary["wall_time_s"]),
        "rollouts": consumed,
        "prompts": consumed / g,
        "generated": stats.get("started", math.nan),
        "acceptance": summary.get("acceptance_rate_mean", math.nan),
        "load": (load["before"][0] + load["after"][0]) / 2 if load else math.nan,
    }


def _acceptance(x: float | None) -> str:
    """`-` for a trust region that admits everything by construction (no acceptance logged)."""
    return "-" if x is None else f"{x:.2f}"


def fmt(x: float | int | None, spec: str) -> str:
    return "never" if x is None else format(x, spec)


def table(root: Path, tasks: list[str], seeds: list[int]) -> str:
    head = (
        "| task | arm | seed | reward first 10 | reward last 20 | updates to 0.8 | train wall s "
        "| rollouts trained | distinct prompts | rollouts generated | acceptance | load |"
    )
    lines = [head, "|" + "---|" * 12]
    for task in tasks:
        for arm in ARMS:
            for seed in seeds:
                p = run_dir(root, task, arm, seed)
                if not (p / "summary.json").exists():
                    continue
                m = measure(p, G[arm])
                lines.append(
                    f"| {task} | {arm} | {seed} | {m['first10']:.2f} | {m['last20']:.2f} | "
                    f"{fmt(m['to_0.8'], 'd')} | {m['wall_s']:.0f} | {m['rollouts']:.0f} | "
                    f"{m['prompts']:.0f} | {m['generated']:.0f} | {_acceptance(m['acceptance'])} | "
                    f"{m['load']:.1f} |"
                )
    return "\n".join(lines)


def mean_of(ms: list[dict], key: str) -> float:
    return sum(m[key] for m in ms) / len(ms)


def median_steps(ms: list[dict]) -> str:
    """Median updates to 0.8, a run that never reached it counting as more than UPDATES."""
    xs = sorted(math.inf if m["to_0.8"] is None else m["to_0.8"] for m in ms)
    n = len(xs)
    med = xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
    return f">{UPDATES}" if math.isinf(med) else f"{med:.0f}"


def aggregate(root: Path, tasks: list[str], seeds: list[int]) -> str:
    """Per task and arm: mean over seeds (updates to 0.8 over the runs that reached it)."""
    lines = [
        "| task | arm | runs | reward first 10 | reward last 20 (min-max) | reached 0.8 "
        "| updates to 0.8: median (mean of runs that reached it) | train wall s: mean (min-max) "
        "| wall s to 0.8: median | load (mean) | distinct prompts |",
        "|" + "---|" * 11,
    ]
    for task in tasks:
        for arm in ARMS:
            dirs = [run_dir(root, task, arm, s) for s in seeds]
            ms = [measure(d, G[arm]) for d in dirs if (d / "summary.json").exists()]
            if not ms:
                continue
            hits = [m["to_0.8"] for m in ms if m["to_0.8"] is not None]
            last = [m["last20"] for m in ms]
            walls = [m["wall_s"] for m in ms]
            to_wall = [wall_to_target(d) for d in dirs if (d / "summary.json").exists()]
            lines.append(
                f"| {task} | {arm} | {len(ms)} | {mean_of(ms, 'first10'):.2f} | {mean_of(ms, 'last20'):.2f} "
                f"({min(last):.2f}-{max(last):.2f}) | {len(hits)}/{len(ms)} | "
                f"{median_steps(ms)} ({fmt(sum(hits) / len(hits) if hits else None, '.0f')}) | "
                f"{mean_of(ms, 'wall_s'):.0f} ({min(walls):.0f}-{max(walls):.0f}) | "
                f"{median_or_never(to_wall)} | {mean_of(ms, 'load'):.1f} | "
                f"{mean_of(ms, 'prompts'):.0f} |"
            )
    return "\n".join(lines)


def wall_to_target(path: Path) -> float | None:
    """Training seconds (`elapsed_s`) at the step where the run first reached 0.8."""
    with open(path / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/reward_mean", "") != ""]
    step = steps_to_target([float(r["train/reward_mean"]) for r in rows])
    return None if step is None else float(rows[step - 1]["elapsed_s"])


def median_or_never(xs: list[float | None]) -> str:
    """Median with a run that never got there counting as the largest."""
    vals = sorted(math.inf if x is None else x for x in xs)
    n = len(vals)
    med = vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2
    return "never" if math.isinf(med) else f"{med:.0f}"


def plots(root: Path, tasks: list[str], seeds: list[int]) -> None:
    """Overlay reward curves per task with frlab.plot, keep only reward.png in the study folder."""
    for task in tasks:
        dirs = [str(run_dir(root, task, a, s)) for a in ARMS for s in seeds]
        dirs = [d for d in dirs if (Path(d) / "summary.json").exists()]
        if not dirs:
            continue
        out = root / f"plots_{task}"
        subprocess.run([sys.executable, "-m", "frlab.plot", *dirs, "--out", str(out)], check=True)
        for png in ("reward.png", "acceptance.png"):
            if (out / png).exists():
                (HERE / f"{task}_{png}").write_bytes((out / png).read_bytes())


def rewards_of(path: Path) -> list[float]:
    with open(path / "metrics.csv", newline="") as f:
        return [float(r["train/reward_mean"]) for r in csv.DictReader(f) if r["train/reward_mean"]]


def moving_average(xs: list[float], w: int = WINDOW) -> list[float]:
    return [
        sum(xs[max(0, i - w + 1) : i + 1]) / len(xs[max(0, i - w + 1) : i + 1])
        for i in range(len(xs))
    ]


def mean_plot(root: Path, tasks: list[str], seeds: list[int]) -> None:
    """Per task: the 10-update moving-average reward, mean over seeds, min-max band per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        for arm, color in zip(ARMS, ("tab:blue", "tab:orange", "tab:green"), strict=True):
            dirs = [run_dir(root, task, arm, s) for s in seeds]
            curves = [moving_average(rewards_of(d)) for d in dirs if (d / "summary.json").exists()]
            if not curves:
                continue
            n = min(map(len, curves))
            steps = range(1, n + 1)
            cols = [[c[i] for c in curves] for i in range(n)]
            ax.plot(
                steps,
                [sum(c) / len(c) for c in cols],
                color=color,
                label=f"{arm} (G={G[arm]}, {len(curves)} seeds)",
            )
            ax.fill_between(steps, [min(c) for c in cols], [max(c) for c in cols],
                            color=color, alpha=0.2, linewidth=0)  # fmt: skip
        ax.axhline(TARGET, color="gray", linestyle=":", linewidth=1)
        ax.set(title=f"{task} ({TASKS[task]}), B=64 rollouts/update", xlabel="optimizer step",
               ylabel=f"reward, {WINDOW}-update moving avg", ylim=(0, 1.02))  # fmt: skip
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / "reward_mean_over_seeds.png", dpi=90)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path("/tmp/svg"))
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    ap.add_argument("--print", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--table", action="store_true", help="only the table and plots")
    args = ap.parse_args()
    if not args.table:
        run_all(args.root, args.tasks, args.seeds, args.print)
    if not args.print:
        print(table(args.root, args.tasks, args.seeds))
        print()
        print(aggregate(args.root, args.tasks, args.seeds))
        plots(args.root, args.tasks, args.seeds)
        mean_plot(args.root, args.tasks, args.seeds)


if __name__ == "__main__":
    main()
