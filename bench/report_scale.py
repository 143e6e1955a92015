"""How long `python -m frlab.report` takes on a large sweep: 200 runs of 1,000 updates.

Writes the runs first (10 arms x 20 seeds, each with metrics.csv of 1,000 updates, three
training metrics, two evaluated benchmarks, summary.json and Hydra's record), then times the
report in this process, phase by phase (read and group, statistics, text outputs, PNGs), with
a threshold so that the Kaplan-Meier path runs too. The baseline, in the same process: the
same per-arm intervals of one metric through rliable's own `get_interval_estimates` (a Python
loop over resamples), to show what the vectorised bootstrap buys. The target: the whole report
under 10 s on the 2-core CPU machine; the command itself (a fresh process: startup and imports
included) is timed too. The last line is `report / target: R`.

    python bench/report_scale.py [--runs 200] [--updates 1000]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

TARGET_S = 10.0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--updates", type=int, default=1000)
    p.add_argument("--arms", type=int, default=10)
    p.add_argument("--reps", type=int, default=5000, help="bootstrap resamples (the default)")
    return p.parse_args(argv)


def write_run(folder: Path, arm: int, seed: int, updates: int, rng: np.random.Generator) -> None:
    hydra = folder / ".hydra"
    hydra.mkdir(parents=True)
    config = {
        "seed": seed,
        "objective": {
            "trust_region": "sequence_bernoulli_kl",
            "sequence_bernoulli_kl": {"delta": 1e-3 * (arm + 1)},
        },
    }
    (hydra / "config.yaml").write_text(yaml.safe_dump(config))
    choices = {"experiment": "bench", "ablation": f"arm{arm}"}
    (hydra / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"runtime": {"choices": choices}}}))
    (hydra / "overrides.yaml").write_text(yaml.safe_dump([f"ablation=arm{arm}", f"seed={seed}"]))
    reward = np.clip(
        np.linspace(0.1, 0.6 + 0.03 * arm, updates) + rng.normal(0, 0.1, updates), 0, 1
    )
    head = [
        "step",
        "elapsed_s",
        "train/reward_mean",
        "train/acceptance_rate",
        "train/policy_lag_mean",
        "eval/a/avg@4",
        "eval/a/avg@4_se",
        "eval/b/avg@4",
    ]
    with (folder / "metrics.csv").open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(head)
        for step in range(1, updates + 1):
            evaluated = step % 100 == 0
            ev = [rng.uniform(), 0.05, rng.uniform()] if evaluated else ["", "", ""]
            out.writerow([step, 2.0 * step, reward[step - 1], rng.uniform(0.8, 1), 1.0, *ev])
    summary = {"status": "finished", "wall_time_s": 2.0 * updates}
    (folder / "summary.json").write_text(json.dumps(summary))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from frlab.report import stats
    from frlab.report.build import Options, build_report
    from frlab.report.plots import write_plots
    from frlab.report.write import write_text_outputs

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "sweep"
        rng = np.random.default_rng(0)
        t0 = time.perf_counter()
        for i in range(args.runs):
            arm, seed = i % args.arms, i // args.arms
            write_run(root / f"arm{arm}_seed{seed}", arm, seed, args.updates, rng)
        print(
            f"wrote {args.runs} runs of {args.updates} updates in {time.perf_counter() - t0:.1f} s"
        )
        options = Options(thresholds=(("train/reward_mean", 0.6),), reps=args.reps)
        phases: dict[str, tuple[float, float]] = {}
        report = timed(phases, "import scipy and rliable.metrics", stats.libraries)
        report = timed(phases, "read, group and statistics", build_report, [root], options)
        timed(phases, "report.md/csv/json", write_text_outputs, report, root / "report")
        pngs = timed(phases, "PNGs", write_plots, report, root / "report")
        for name, (wall, cpu) in phases.items():
            print(f"  {name}: {wall:.2f} s wall, {cpu:.2f} s CPU")
        total = sum(w for w, _ in phases.values())
        cpu = sum(c for _, c in phases.values())
        print(
            f"report: {total:.2f} s wall, {cpu:.2f} s CPU for {args.runs} runs ({args.arms} "
            f"arms, {len(pngs)} PNGs); target {TARGET_S} s"
        )
        cli = cli_seconds(root, args.reps)
        print(f"the command end to end (python -m frlab.report, a fresh process): {cli:.2f} s")
        baseline = rliable_baseline(report, args.reps)
        print(
            f"baseline (rliable's get_interval_estimates, one metric, every arm): {baseline:.2f} s"
        )
        print(
            f"report / target: {total / TARGET_S:.2f} (CPU time / target: {cpu / TARGET_S:.2f}; "
            f"the command: {cli / TARGET_S:.2f})"
        )
    return 0


def timed(phases: dict, name: str, func, *args):
    """Run func(*args), recording its wall and CPU seconds (CPU, its children's included: an
    upper bound of an idle machine's wall time, whatever else the machine runs)."""
    wall, cpu = time.perf_counter(), cpu_seconds()
    result = func(*args)
    phases[name] = (time.perf_counter() - wall, cpu_seconds() - cpu)
    return result


def cpu_seconds() -> float:
    """CPU seconds of this process and of its finished children (the report's figure workers)."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def cli_seconds(root: Path, reps: int) -> float:
    """Wall seconds of `python -m frlab.report` on the runs, startup and imports included."""
    import subprocess

    command = [
        sys.executable,
        "-m",
        "frlab.report",
        str(root),
        "--out",
        str(root / "cli"),
        "--threshold",
        "train/reward_mean=0.6",
        "--reps",
        str(reps),
    ]
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - start


def rliable_baseline(report, reps: int) -> float:
    """The final-reward intervals of every arm through rliable's own bootstrap loop."""
    from rliable import library

    exp = report.experiments[0]
    data = {
        a.label: np.array(exp.table[a.label]["train/reward_mean"].values)[:, None] for a in exp.arms
    }
    np.random.seed(0)
    t = time.perf_counter()
    library.get_interval_estimates(data, lambda s: np.array([np.mean(s)]), reps=reps)
    return time.perf_counter() - t


if __name__ == "__main__":
    raise SystemExit(main())
