"""From run folders to the report's content: census, table, comparisons, time to a threshold.

`build_report(paths, options)` reads the runs, groups them into experiments and arms, and
computes every number the outputs show (`frlab.report.write` renders them, `frlab.report.plots`
draws them). Nothing here formats text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from frlab.provenance import frlab_provenance
from frlab.report import stats, values
from frlab.report.arms import Arm, choose_runs, group_arms, pick_baseline, unplaced
from frlab.report.runs import ReportError, Run, find_runs, load_runs


@dataclass(frozen=True)
class Options:
    """What the command line chose (defaults: the declared windows and a fixed bootstrap)."""

    metrics: tuple[str, ...] = ()  # more metrics from metrics.csv (window means)
    thresholds: tuple[tuple[str, float], ...] = ()
    smooth: int = 1  # trailing mean of this many updates before a threshold is tested
    window: float = 0.1  # the final window of training metrics, a fraction of the updates
    baseline: str | None = None
    include_unfinished: bool = False
    reps: int = 5000  # bootstrap resamples
    seed: int = 0  # the bootstrap's seed


@dataclass
class Threshold:
    metric: str
    value: float
    updates: dict[str, stats.TimeTo] = field(default_factory=dict)  # arm label -> KM
    wall_s: dict[str, stats.TimeTo] = field(default_factory=dict)
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # per run, per arm


@dataclass
class Experiment:
    """One table: an experiment's arms and every number about them."""

    name: str
    arms: list[Arm]
    baseline: Arm
    metrics: list[str]
    differing_keys: list[str]
    evaluation: dict[str, Any]
    table: dict[str, dict[str, stats.Estimate]] = field(default_factory=dict)
    per_seed: dict[str, dict[str, list[values.Value]]] = field(default_factory=dict)
    iqm: dict[str, dict[str, stats.Estimate]] = field(default_factory=dict)  # arm -> stat -> IQM
    comparisons: dict[str, dict[str, stats.Comparison]] = field(default_factory=dict)
    thresholds: list[Threshold] = field(default_factory=list)
    eval_steps: dict[str, list[int]] = field(default_factory=dict)  # arm -> last-eval steps


@dataclass
class Report:
    paths: list[str]
    options: Options
    provenance: dict[str, Any]
    experiments: list[Experiment]
    unplaced: list[Run]


def build_report(paths: Sequence[str | Path], options: Options) -> Report:
    stats.libraries()  # a missing extra is said before anything is read
    runs = load_runs(find_runs(paths))
    experiments = []
    for name, arms in group_arms(runs).items():
        for arm in arms:
            choose_runs(arm, options.include_unfinished)
        experiments.append(experiment(name, arms, options))
    if not experiments:
        raise ReportError(f"{', '.join(map(str, paths))}: no run with a .hydra/config.yaml record")
    commits = sorted({str(r.summary["frlab"].get("commit")) for r in runs if recorded(r)})
    unrecorded = sum(not recorded(r) for r in runs)
    return Report(
        paths=[str(p) for p in paths],
        options=options,
        provenance={
            "report": frlab_provenance(),
            "runs_commits": commits,
            "runs_without_commit": unrecorded,
        },
        experiments=experiments,
        unplaced=unplaced(runs),
    )


def recorded(run: Run) -> bool:
    """Whether the run's summary.json names the frlab commit that made it."""
    return isinstance((run.summary or {}).get("frlab"), dict)


def table_metrics(arms: Sequence[Arm], extra: Sequence[str]) -> list[str]:
    """Benchmarks' evaluation metrics, then the training metrics, then `--metric`s."""
    used = [r for a in arms for r in a.used] or [r for a in arms for r in a.runs]
    names = values.eval_metrics(used) + list(values.DEFAULT_TRAIN_METRICS)
    names += [values.UPDATES_PER_MINUTE] + [m for m in extra if m not in names]
    return names


def experiment(name: str, arms: list[Arm], options: Options) -> Experiment:
    baseline = pick_baseline(arms, options.baseline)
    differing = sorted({k for a in arms for k in a.differences})
    exp = Experiment(
        name=name,
        arms=[baseline, *[a for a in arms if a is not baseline]],
        baseline=baseline,
        metrics=table_metrics(arms, options.metrics),
        differing_keys=differing,
        evaluation=evaluation_settings(baseline),
    )
    for arm in exp.arms:
        fill_arm(exp, arm, options)
    for metric, value in options.thresholds:
        exp.thresholds.append(threshold(exp.arms, metric, value, options.smooth))
    return exp


def fill_arm(exp: Experiment, arm: Arm, options: Options) -> None:
    """The arm's per-seed values, estimates, IQM and comparison with the baseline."""
    runs = arm.used
    seeds = [r.seed if r.seed is not None else str(r.path) for r in runs]
    per_seed = {m: [values.run_value(r, m, options.window) for r in runs] for m in exp.metrics}
    exp.per_seed[arm.label] = per_seed
    exp.table[arm.label] = {
        m: stats.estimate([v.value for v in vs], seeds, options.reps, options.seed)
        for m, vs in per_seed.items()
    }
    exp.eval_steps[arm.label] = sorted(
        {
            v.step
            for m, vs in per_seed.items()
            if values.is_eval(m)
            for v in vs
            if v.step is not None
        }
    )
    exp.iqm[arm.label] = benchmark_iqm(per_seed, options)
    if arm is not exp.baseline:
        base = exp.per_seed[exp.baseline.label]
        base_seeds = [r.seed if r.seed is not None else str(r.path) for r in exp.baseline.used]
        exp.comparisons[arm.label] = {
            m: stats.compare(
                dict(zip(seeds, (v.value for v in per_seed[m]), strict=True)),
                dict(zip(base_seeds, (v.value for v in base[m]), strict=True)),
                options.reps,
                options.seed,
                improvement_interval=m in main_metrics(exp.metrics),
            )
            for m in exp.metrics
        }


def main_metrics(metrics: Sequence[str]) -> list[str]:
    """The metrics a paper's table is about: evaluations and the final train reward."""
    return [m for m in metrics if values.is_eval(m) or m == values.REWARD]


def benchmark_iqm(per_seed: dict[str, list[values.Value]], options: Options) -> dict[str, Any]:
    """Per evaluation statistic (e.g. avg@4): the IQM over runs x benchmarks (not `eval/mean`)."""
    groups: dict[str, list[str]] = {}
    for metric in per_seed:
        parts = metric.split("/")
        if values.is_eval(metric) and len(parts) == 3 and parts[1] != "mean":
            groups.setdefault(parts[2], []).append(metric)
    out = {}
    for stat, metrics in groups.items():
        if len(metrics) < 2:
            continue
        scores = np.array(
            [[per_seed[m][i].value for m in metrics] for i in range(len(per_seed[metrics[0]]))]
        )
        found = stats.iqm(scores, options.reps, options.seed) if scores.size else None
        if found is not None:
            out[stat] = found
    return out


def threshold(arms: Sequence[Arm], metric: str, value: float, smooth: int) -> Threshold:
    """Per arm: which runs reached `metric >= value`, and Kaplan-Meier medians."""
    out = Threshold(metric, value)
    for arm in arms:
        rows = []
        for run in arm.used:
            found = values.crossing(run, metric, value, smooth)
            if found is not None:
                rows.append(
                    {
                        "seed": run.seed,
                        "reached": found.reached,
                        "update": found.update,
                        "wall_s": found.wall_s,
                    }
                )
        out.runs[arm.label] = rows
        reached = [r["reached"] for r in rows]
        out.updates[arm.label] = stats.time_to([r["update"] for r in rows], reached)
        wall = [r["wall_s"] if math.isfinite(r["wall_s"]) else math.inf for r in rows]
        out.wall_s[arm.label] = stats.time_to(wall, reached)
    return out


EVAL_KEYS = (
    "k",
    "limit",
    "every_n_steps",
    "at_start",
    "sampling.temperature",
    "sampling.top_p",
    "sampling.max_new_tokens",
)


def evaluation_settings(arm: Arm) -> dict[str, Any]:
    """The evaluation's k, sampling, benchmarks and problems, as the baseline arm ran it."""
    config = arm.config
    out = {k: config[f"eval.{k}"] for k in EVAL_KEYS if f"eval.{k}" in config}
    benchmarks = config.get("eval.benchmarks")
    if isinstance(benchmarks, list):
        out["benchmarks"] = [
            b.get("name", str(b)) if isinstance(b, dict) else str(b) for b in benchmarks
        ]
    return out
