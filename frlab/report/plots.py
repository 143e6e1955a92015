"""The report's PNGs (matplotlib, Agg), one folder per experiment under the output folder.

- `<metric>.png`, for every training metric of the table: each arm's mean over its seeds with
  a band, and a thin line per seed, against the update (left) and against training wall time
  (right). The band is the 95% t interval (scipy) from 4 seeds, and the seeds' range (min to
  max) for fewer, as in the table: a t interval from 2 seeds is wider than the metric's range.
  The band is drawn only where every seed of the arm has a value; past the point where a seed
  stops, the mean is dashed and labelled with the number of seeds left.
- `intervals.png`: each arm's mean and 95% interval for the evaluation metrics and the final
  train reward (a hollow marker and the seeds' range for low n).
- `threshold_<metric>.png`: the Kaplan-Meier fraction of runs that reached the threshold,
  against updates and wall seconds, censored runs marked.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from frlab.report import stats, values
from frlab.report.arms import Arm
from frlab.report.build import Experiment, Report, main_metrics
from frlab.report.runs import Run

WALL_POINTS = 200
DPI = 100
MEAN_POINTS = 200  # points drawn of an arm's mean (every k-th update beyond that)
SEED_POINTS = 80  # points drawn of each seed's thin line: drawing them is most of a figure's cost


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def file_stem(metric: str) -> str:
    return metric.replace("/", "_").replace("@", "at")


def aligned_by_update(runs: Sequence[Run], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(updates, values [runs, updates]) with NaN where a run has no value at an update."""
    last = max((r.last_update for r in runs), default=0)
    x = np.arange(1, last + 1, dtype=float)
    grid = np.full((len(runs), x.size), np.nan)
    for i, run in enumerate(runs):
        rows = run.update_rows()
        col = run.columns.get(metric)
        if col is not None and rows.size:
            grid[i, run.steps[rows].astype(int) - 1] = col[rows]
    return x, grid


def aligned_by_wall(runs: Sequence[Run], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, values [runs, points]) on a common grid; NaN outside a run's own time span."""
    series = []
    for run in runs:
        rows = run.update_rows()
        elapsed, col = run.columns.get("elapsed_s"), run.columns.get(metric)
        if col is None or elapsed is None or not rows.size:
            series.append((np.zeros(0), np.zeros(0)))
            continue
        t, y = elapsed[rows], col[rows]
        keep = np.isfinite(t) & np.isfinite(y)
        series.append((t[keep], y[keep]))
    end = max((float(t.max()) for t, _ in series if t.size), default=0.0)
    x = np.linspace(0.0, end, WALL_POINTS)
    grid = np.full((len(runs), x.size), np.nan)
    for i, (t, y) in enumerate(series):
        if t.size:
            inside = (x >= t.min()) & (x <= t.max())
            grid[i, inside] = np.interp(x[inside], t, y)
    return x, grid


def band(grid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean, the band's low and high ends and the number of seeds, per point: the 95% t
    interval (scipy's t quantile) for more than LOW_N seeds, the seeds' range for fewer."""
    _, scipy_stats = stats.libraries()
    n = np.isfinite(grid).sum(axis=0)
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # a point no seed reached: NaN
        mean = np.nanmean(grid, axis=0)
        sd = np.nanstd(grid, axis=0, ddof=1)
        quantile = scipy_stats.t.ppf(0.5 + stats.CONFIDENCE / 2, np.maximum(n - 1, 1))
        half = np.where(n > 1, quantile * sd / np.sqrt(np.maximum(n, 1)), np.nan)
        if grid.shape[0] <= stats.LOW_N:
            return mean, np.nanmin(grid, axis=0), np.nanmax(grid, axis=0), n
    return mean, mean - half, mean + half, n


def thinned(x: np.ndarray, grid: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray]:
    """Every k-th column (the raw values there, nothing averaged), at most about `points`."""
    step = max(1, -(-x.size // points))
    return x[::step], grid[:, ::step]


def draw_seeds(ax: Any, x: np.ndarray, grid: np.ndarray, color: str) -> None:
    """Every seed's thin line as one NaN-separated line in a pale shade of the arm's colour
    (one artist without transparency: the cheapest to draw)."""
    from matplotlib.colors import to_rgb

    x, grid = thinned(x, grid, SEED_POINTS)
    gap = np.full((grid.shape[0], 1), np.nan)
    xs = np.hstack([np.broadcast_to(x, grid.shape), gap]).ravel()
    pale = tuple(0.7 + 0.3 * c for c in to_rgb(color))
    ax.plot(xs, np.hstack([grid, gap]).ravel(), color=pale, linewidth=0.6, antialiased=False)


def draw_arm(ax: Any, x: np.ndarray, grid: np.ndarray, color: str, label: str) -> None:
    """The mean solid with its band where every seed has a value, dashed (and labelled with
    the seeds left) where some have stopped."""
    x, grid = thinned(x, grid, MEAN_POINTS)
    mean, low, high, n = band(grid)
    full = n == grid.shape[0]
    if ((n > 0) & ~full).any():  # some seed has stopped (or not begun): the mean dashed there
        ax.plot(x, np.where(n > 0, mean, np.nan), "--", color=color, linewidth=1.0)
    label = f"{label} (n={grid.shape[0]}{', band: range' if grid.shape[0] <= stats.LOW_N else ''})"
    ax.plot(x, np.where(full, mean, np.nan), color=color, linewidth=2.0, label=label)
    if grid.shape[0] > 1:
        ax.fill_between(x, low, high, where=full, color=color, alpha=0.2)
    started = np.flatnonzero(full)
    partial = np.flatnonzero((n > 0) & ~full)
    partial = partial[partial > started[0]] if started.size else partial  # where seeds stop
    if partial.size:
        first = int(partial[0])
        text = f"n={int(n[first])} from here"
        ax.annotate(text, (x[first], mean[first]), fontsize=7, color=color)


def curves(exp: Experiment, metric: str, folder: Path) -> Path:
    """`<metric>.png`: against updates (left) and training wall seconds (right)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), dpi=DPI)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, align, xlabel in (
        (axes[0], aligned_by_update, "update"),
        (axes[1], aligned_by_wall, "training wall seconds"),
    ):
        arms = [(a, colors[i % len(colors)]) for i, a in enumerate(exp.arms) if a.used]
        aligned = [(a.label, *align(a.used, metric), color) for a, color in arms]
        for _, x, grid, color in aligned:  # every arm's seeds below every arm's mean
            draw_seeds(ax, x, grid, color)
        for label, x, grid, color in aligned:
            draw_arm(ax, x, grid, color, label)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(metric)
    if axes[0].lines:
        axes[0].legend(fontsize=7, loc="upper left")  # "best" searches every line: slow
    title = "mean, 95% t band (the seeds' range at 2-3 seeds), every seed"
    fig.suptitle(f"{exp.name}: {metric} ({title})", fontsize=9)
    fig.subplots_adjust(left=0.07, right=0.99, bottom=0.12, top=0.91, wspace=0.12)
    path = folder / f"{file_stem(metric)}.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def interval_plot(exp: Experiment, folder: Path) -> Path | None:
    metrics = [
        m for m in main_metrics(exp.metrics) if any(exp.table[a.label][m].n for a in exp.arms)
    ]
    if not metrics:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(
        1,
        len(metrics),
        figsize=(3.2 * len(metrics), 0.6 * len(exp.arms) + 1.5),
        dpi=DPI,
        squeeze=False,
    )
    for ax, metric in zip(axes[0], metrics, strict=True):
        interval_panel(ax, exp.arms, exp, metric)
    axes[0][0].set_yticks(range(len(exp.arms)), [a.label for a in exp.arms], fontsize=7)
    fig.suptitle(f"{exp.name}: mean and 95% interval (hollow: low n, seeds' range)", fontsize=9)
    fig.tight_layout()
    path = folder / "intervals.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def interval_panel(ax: Any, arms: Sequence[Arm], exp: Experiment, metric: str) -> None:
    for y, arm in enumerate(arms):
        e = exp.table[arm.label][metric]
        if e.n == 0:
            continue
        hollow = e.method != "bootstrap"
        if math.isfinite(e.low):
            ax.plot([e.low, e.high], [y, y], color="C0", linewidth=3 if not hollow else 1.5)
        ax.plot([e.mean], [y], "o", color="C0", markerfacecolor="white" if hollow else "C0")
    ax.set_title(values.TITLES.get(metric, metric), fontsize=8)
    ax.set_yticks([])
    ax.set_ylim(-0.5, len(arms) - 0.5)
    ax.invert_yaxis()
    ax.grid(alpha=0.3, axis="x")


def threshold_plot(exp: Experiment, index: int, folder: Path) -> Path:
    th = exp.thresholds[index]
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), dpi=DPI)
    for ax, unit, by_arm in ((axes[0], "updates", th.updates), (axes[1], "wall s", th.wall_s)):
        for i, arm in enumerate(exp.arms):
            km = by_arm[arm.label]
            xs = [0.0, *km.times]
            ys = [0.0, *km.fraction]
            ax.step(
                xs, ys, where="post", color=f"C{i}", label=f"{arm.label}: {km.reached} of {km.n}"
            )
            if km.censored:
                level = km.fraction[-1] if km.fraction else 0.0
                finite = [c for c in km.censored if math.isfinite(c)]
                ax.plot(finite, [level] * len(finite), "+", color=f"C{i}", markersize=9)
        ax.set_xlabel(unit)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of runs that reached it (KM)")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"{exp.name}: {th.metric} >= {th.value} (+: censored runs)", fontsize=9)
    fig.tight_layout()
    path = folder / f"threshold_{file_stem(th.metric)}.png"
    fig.savefig(path)
    plt.close(fig)
    return path


Job = tuple[str, int, Any]  # (figure kind, experiment index, metric or threshold index)
_SHARED: dict[str, Any] = {}  # the report and output folder, inherited by forked workers


def figure_jobs(report: Report) -> list[Job]:
    jobs: list[Job] = []
    for i, exp in enumerate(report.experiments):
        for metric in exp.metrics:
            if values.is_eval(metric) or metric == values.UPDATES_PER_MINUTE:
                continue
            if any(metric in r.columns for a in exp.arms for r in a.used):
                jobs.append(("curves", i, metric))
        jobs.append(("intervals", i, None))
        jobs += [("threshold", i, k) for k in range(len(exp.thresholds))]
    return jobs


def draw(job: Job) -> Path | None:
    """One figure of the shared report (in this process or a forked worker)."""
    kind, i, arg = job
    exp = _SHARED["report"].experiments[i]
    folder = _SHARED["out"] / exp.name
    if kind == "curves":
        return curves(exp, arg, folder)
    if kind == "intervals":
        return interval_plot(exp, folder)
    return threshold_plot(exp, arg, folder)


def write_plots(report: Report, out: Path, workers: int = 2) -> list[Path]:
    """Every figure of the report; on a POSIX machine with several cores, drawn by `workers`
    forked processes at once (a figure is independent of the others; matplotlib draws on one
    core)."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    for exp in report.experiments:
        (out / exp.name).mkdir(parents=True, exist_ok=True)
    jobs = figure_jobs(report)
    _SHARED.update(report=report, out=out)
    try:
        parallel = workers > 1 and len(jobs) > 1 and (os.cpu_count() or 1) > 1
        if parallel and "fork" in multiprocessing.get_all_start_methods():
            pyplot()  # imported once here (about 1 s of CPU), not again in every worker
            context = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context) as pool:
                found = list(pool.map(draw, jobs))
        else:
            found = [draw(job) for job in jobs]
    finally:
        _SHARED.clear()
    return [p for p in found if p is not None]
