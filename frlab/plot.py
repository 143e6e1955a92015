"""`python -m frlab.plot RUN_DIR [RUN_DIR ...] [--out DIR]`: PNG curves from metrics.csv.

Plots, against the optimizer step, the curves that show whether a FlashREINFORCE run is
healthy: mean reward, the trust region's acceptance rate, the policy lag (mean, and max
dashed) and the response length. Several runs (e.g. a sweep) are overlaid with a legend;
a folder without its own metrics.csv (a sweep folder) expands to the runs below it. The legend
label is the run's folder name relative to the common parent (for sweeps: the overrides).
Matplotlib's Agg backend: no display needed.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frlab.tracking.metrics_file import METRICS_FILE, read_metrics

# (file stem, title, y label, [(metric, line style)])
PANELS: tuple[tuple[str, str, str, tuple[tuple[str, str], ...]], ...] = (
    ("reward", "Mean reward", "reward", (("train/reward_mean", "-"),)),
    (
        "acceptance",
        "Trust-region acceptance rate",
        "accepted fraction",
        (("train/acceptance_rate", "-"),),
    ),
    (
        "lag",
        "Policy lag (mean solid, max dashed)",
        "versions",
        (("train/policy_lag_mean", "-"), ("train/policy_lag_max", "--")),
    ),
    (
        "response_length",
        "Response length",
        "action tokens / trajectory",
        (("train/response_tokens_mean", "-"),),
    ),
)


@dataclass
class Run:
    """One run's metric rows and its legend label."""

    path: Path
    label: str
    rows: list[dict[str, float]]

    def series(self, metric: str) -> tuple[list[float], list[float]]:
        pts = [
            (r["step"], r[metric])
            for r in self.rows
            if math.isfinite(r.get(metric, math.nan)) and math.isfinite(r.get("step", math.nan))
        ]
        return [p[0] for p in pts], [p[1] for p in pts]


def expand_run_dirs(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Run folders: a path holding metrics.csv, or every run below a sweep folder (sorted).

    A run folder holds frlab's own metrics.csv at its root (next to summary.json); metrics.csv
    files below a run folder (the Lightning CSV logger's `csv/version_0/metrics.csv`) belong to
    that run and are not runs of their own.
    """
    runs: list[Path] = []
    for p in map(Path, paths):
        if (p / METRICS_FILE).is_file():
            runs.append(p)
        elif p.is_dir():
            found = outermost(m.parent for m in p.rglob(METRICS_FILE))
            if not found:
                raise FileNotFoundError(f"no {METRICS_FILE} in {p} or below")
            runs.extend(found)
        else:
            raise FileNotFoundError(f"not a run folder: {p}")
    return list(dict.fromkeys(runs))


def outermost(folders: Iterable[Path]) -> list[Path]:
    """The folders (sorted) that do not lie below another of the given folders."""
    kept: set[Path] = set()
    for folder in sorted(set(folders)):  # an ancestor sorts before its descendants
        if kept.isdisjoint(folder.parents):
            kept.add(folder)
    return sorted(kept)


def load_runs(paths: Sequence[str | os.PathLike[str]]) -> list[Run]:
    dirs = expand_run_dirs(paths)
    parent = Path(os.path.commonpath([d.resolve() for d in dirs])) if len(dirs) > 1 else None
    runs = []
    for d in dirs:
        label = str(d.resolve().relative_to(parent)) if parent else d.resolve().name
        runs.append(Run(d, label or d.name, read_metrics(d)))
    return runs


def make_figure(
    runs: Sequence[Run], title: str, ylabel: str, metrics: Sequence[tuple[str, str]]
) -> Any:
    """One panel: every run's curve(s) for `metrics`, with a legend naming the runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, run in enumerate(runs):
        for j, (metric, style) in enumerate(metrics):
            x, y = run.series(metric)
            if not x:
                continue
            label = run.label if j == 0 else None
            ax.plot(x, y, style, color=colors[i % len(colors)], label=label, linewidth=1.5)
    ax.set_title(title)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def plot_runs(
    paths: Sequence[str | os.PathLike[str]], out_dir: str | os.PathLike[str]
) -> list[Path]:
    """Write one PNG per panel (reward, acceptance, lag, response_length) into `out_dir`."""
    import matplotlib.pyplot as plt

    runs = load_runs(paths)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, title, ylabel, metrics in PANELS:
        fig = make_figure(runs, title, ylabel, metrics)
        path = out / f"{stem}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def write_plots(run_dir: Path) -> list[Path]:
    """PNG curves of one run into `<run>/plots` (failures are logged, never fatal: plotting
    must never lose a finished run)."""
    import logging

    try:
        return plot_runs([run_dir], run_dir / "plots")
    except Exception as exc:  # noqa: BLE001
        logging.getLogger(__name__).warning("plots not written: %s", exc)
        return []


def default_out(paths: Sequence[str]) -> Path:
    """`<dir>/plots` for a single folder argument, else `./plots`."""
    return Path(paths[0]) / "plots" if len(paths) == 1 else Path("plots")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m frlab.plot", description=__doc__.splitlines()[0]
    )
    parser.add_argument("runs", nargs="+", help="run folders (with metrics.csv) or sweep folders")
    parser.add_argument("--out", default=None, help="output folder (default: RUN_DIR/plots)")
    args = parser.parse_args(argv)
    try:
        written = plot_runs(args.runs, args.out or default_out(args.runs))
    except FileNotFoundError as exc:
        parser.exit(2, f"frlab.plot: {exc}\n")
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
