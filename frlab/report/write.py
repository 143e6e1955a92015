"""The report's text outputs: report.md (ready to paste), report.csv (tidy), report.json.

report.md holds, per experiment: the provenance, the arms and the config keys that tell them
apart, the evaluation settings, the census (arm x seed), the main table (arms as rows, metrics
as columns, baseline first), every seed's values, the comparisons with the baseline and the
times to a threshold. report.csv has one row per experiment, arm, metric and statistic;
report.json holds everything, NaN written as null. Files are written atomically.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from frlab.report import stats, values
from frlab.report.build import Experiment, Report

LOW_N_NOTE = (
    "‡ low n (2-3 seeds): the mean and, in parentheses, the range of the seeds' values "
    "(min-max), "
    "not an interval; a bootstrap has too few distinct resamples. Every seed's value is listed "
    "below; scipy's t interval is in report.csv (`t_low`, `t_high`)."
)


def num(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3f}"


def title(metric: str) -> str:
    return values.TITLES.get(metric, metric)


def cell(e: stats.Estimate, launched: int) -> str:
    if e.n == 0:
        return "not logged"
    missing = f" ({launched - e.n} without it)" if e.n < launched else ""
    if e.method == "bootstrap":
        return f"{num(e.mean)} [{num(e.low)}, {num(e.high)}]{missing}"
    if e.method == "range":
        return f"{num(e.mean)} ({num(e.low)}-{num(e.high)}) ‡{missing}"
    return f"{num(e.mean)} ‡{missing}"


def md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def main_table(exp: Experiment) -> list[str]:
    """Arms as rows, metrics as columns: mean [95% interval] (n in its own column)."""
    stat_names = sorted({s for arm in exp.arms for s in exp.iqm.get(arm.label, {})})
    head = (
        ["arm", "seeds used"] + [title(m) for m in exp.metrics] + [f"IQM {s}" for s in stat_names]
    )
    rows = []
    for arm in exp.arms:
        row = [
            arm.label + (" (baseline)" if arm is exp.baseline else ""),
            f"{len(arm.used)} of {len(arm.runs)}",
        ]
        row += [cell(exp.table[arm.label][m], len(arm.used)) for m in exp.metrics]
        for s in stat_names:
            found = exp.iqm[arm.label].get(s)
            row.append(cell(found, found.n) if found else "-")
        rows.append(row)
    return md_table(head, rows)


def census(exp: Experiment) -> list[str]:
    lines = [f"- {arm.header}" for arm in exp.arms]
    rows = []
    for arm in exp.arms:
        for use in sorted(arm.uses, key=lambda u: (u.run.seed is None, u.run.seed or 0)):
            run = use.run
            rows.append(
                [
                    arm.label,
                    str(run.seed),
                    run.status,
                    str(run.last_update),
                    num(run.wall_s),
                    "yes" if use.used else f"no: {use.reason}",
                    f"`{run.path.name}`",
                ]
            )
    head = ["arm", "seed", "status", "last update", "wall s", "used", "folder"]
    return lines + [""] + md_table(head, rows)


def per_seed(exp: Experiment) -> list[str]:
    rows = []
    for arm in exp.arms:
        for i, run in enumerate(arm.used):
            row = [arm.label, str(run.seed)]
            for m in exp.metrics:
                v = exp.per_seed[arm.label][m][i]
                text = num(v.value)
                if math.isfinite(v.se):
                    text += f" ± {num(v.se)}"
                if values.is_eval(m) and v.step is not None:
                    text += f" @{v.step}"
                row.append(text)
            rows.append(row)
    return md_table(["arm", "seed"] + [title(m) for m in exp.metrics], rows)


def comparisons(exp: Experiment) -> list[str]:
    rows = []
    for label, by_metric in exp.comparisons.items():
        for m in exp.metrics:
            c = by_metric[m]
            if not math.isfinite(c.difference):
                continue
            interval = f"[{num(c.low)}, {num(c.high)}] ({c.method})" if c.method != "none" else "-"
            pairing = (
                f"paired, {c.n} seeds" if c.paired else f"**unpaired** ({c.n} vs {c.n_baseline})"
            )
            poi = num(c.improvement)
            if math.isfinite(c.improvement_low):
                poi += f" [{num(c.improvement_low)}, {num(c.improvement_high)}]"
            wins = f"{c.wins} of {c.n}" if c.wins is not None else "-"
            low = " ‡" if c.low_n else ""
            rows.append([label, title(m), num(c.difference) + low, interval, pairing, poi, wins])
    head = [
        "arm",
        "metric",
        "difference",
        "95% interval",
        "pairing",
        "P(arm > baseline)",
        "seeds where arm is higher",
    ]
    return md_table(head, rows)


def thresholds(exp: Experiment) -> list[str]:
    lines = []
    for th in exp.thresholds:
        lines += ["", f"`{th.metric}` >= {th.value}:", ""]
        rows = []
        for arm in exp.arms:
            km_u, km_w = th.updates[arm.label], th.wall_s[arm.label]
            rows.append(
                [arm.label, f"{km_u.reached} of {km_u.n}", median(km_u, whole=True), median(km_w)]
            )
        lines += md_table(["arm", "reached by", "KM median updates", "KM median wall s"], rows)
    return lines


def median(km: stats.TimeTo, whole: bool = False) -> str:
    """The Kaplan-Meier median; `whole`: a count of updates, printed as a whole number when
    it is one (8, not 8.000)."""
    if km.n == 0:
        return "not logged"
    if not math.isfinite(km.median):
        return "not reached by half the runs"
    if whole and float(km.median).is_integer():
        return str(int(km.median))
    return num(km.median)


def markdown(report: Report) -> str:
    out = ["# frlab report", ""] + provenance(report)
    for exp in report.experiments:
        out += experiment_md(exp, report)
    if report.unplaced:
        out += ["", "## Runs without a config record (in no arm)", ""]
        out += [f"- `{r.path}`: no .hydra/config.yaml, status {r.status}" for r in report.unplaced]
    return "\n".join(out) + "\n"


def provenance(report: Report) -> list[str]:
    opts, prov = report.options, report.provenance["report"]
    dirty = " (with uncommitted changes)" if prov.get("dirty") else ""
    runs_commits = ", ".join(f"`{c}`" for c in report.provenance["runs_commits"]) or "-"
    if report.provenance["runs_without_commit"]:
        runs_commits += f" ({report.provenance['runs_without_commit']} runs did not record one)"
    used = "finished and unfinished (their last window)" if opts.include_unfinished else "finished"
    return [
        f"- made by `python -m frlab.report` at frlab commit `{prov.get('commit')}`{dirty}",
        f"- runs made at frlab commit(s): {runs_commits}",
        f"- from: {', '.join(f'`{p}`' for p in report.paths)}",
        "- windows: evaluation metrics at each run's last evaluation; training metrics the mean "
        f"over the last {opts.window:.0%} of the run's updates; updates / min over the whole run",
        f"- runs used: {used}",
        "- intervals: 95%; from 4 seeds rliable's stratified bootstrap (percentile, "
        f"{opts.reps} resamples, seed {opts.seed}); 2-3 seeds: the range, marked ‡",
    ]


def setting(value: Any) -> str:
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)


def experiment_md(exp: Experiment, report: Report) -> list[str]:
    out = ["", f"## Experiment `{exp.name}`", ""]
    out.append(
        "Config keys that differ between the arms: "
        + (", ".join(f"`{k}`" for k in exp.differing_keys) or "none (one arm)")
    )
    out += [""] + md_table(
        ["arm", "its values of those keys", "preset"],
        [
            [
                a.label,
                ", ".join(f"{k}={v}" for k, v in a.differences.items()) or "-",
                "yes" if a.is_preset else "no",
            ]
            for a in exp.arms
        ],
    )
    if exp.evaluation:
        settings = ", ".join(f"{k} {setting(v)}" for k, v in exp.evaluation.items())
        out += ["", f"Evaluation: {settings}"]
    out += ["", "### Census", ""] + census(exp)
    out += ["", "### Table", ""] + main_table(exp)
    out += ["", "Each cell: the mean over seeds [95% interval]. " + LOW_N_NOTE]
    steps = {a: s for a, s in exp.eval_steps.items() if s}
    if len({tuple(s) for s in steps.values()}) > 1:
        out += [
            "",
            "**Warning**: the arms' last evaluations are at different updates: "
            + "; ".join(f"{a}: {s}" for a, s in steps.items()),
        ]
    out += ["", "### Every seed", ""] + per_seed(exp)
    out += [
        "",
        "(± the within-run standard error of an evaluation over its problems; @N: the "
        "update of the run's last evaluation.)",
    ]
    if exp.comparisons:
        out += ["", f"### Against the baseline `{exp.baseline.label}`", ""] + comparisons(exp)
    if exp.thresholds:
        out += ["", "### Time to a threshold (Kaplan-Meier; runs that never reach it censored)"]
        out += thresholds(exp)
    return out


def terminal(report: Report) -> str:
    """The main tables, as printed after a report is written."""
    out = []
    for exp in report.experiments:
        out += [f"== {exp.name} (baseline: {exp.baseline.label})"]
        out += [f"   {a.header}" for a in exp.arms] + main_table(exp)
    return "\n".join(out)


def tidy_rows(report: Report) -> Iterator[tuple[str, str, str, str, Any]]:
    """(experiment, arm, metric, statistic, value) for report.csv."""
    for exp in report.experiments:
        for arm in exp.arms:
            a = arm.label
            yield exp.name, a, "", "launched", len(arm.runs)
            yield exp.name, a, "", "used", len(arm.used)
            for m in exp.metrics:
                e = exp.table[a][m]
                for stat in ("n", "mean", "low", "high", "method", "t_low", "t_high"):
                    yield exp.name, a, m, stat, getattr(e, stat)
                for s, v in zip(e.seeds, e.values, strict=True):
                    yield exp.name, a, m, f"seed={s}", v
                c = exp.comparisons.get(a, {}).get(m)
                if c is not None:
                    for stat, v in asdict(c).items():
                        yield exp.name, a, m, f"vs_baseline_{stat}", v
            for s, e in exp.iqm.get(a, {}).items():
                for stat in ("n", "mean", "low", "high", "method"):
                    yield exp.name, a, f"IQM {s}", stat, getattr(e, stat)
            for th in exp.thresholds:
                name = f"{th.metric}>={th.value}"
                for unit, km in (("updates", th.updates[a]), ("wall_s", th.wall_s[a])):
                    yield exp.name, a, name, "reached", km.reached
                    yield exp.name, a, name, "n", km.n
                    yield exp.name, a, name, f"km_median_{unit}", km.median


def csv_text(report: Report) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["experiment", "arm", "metric", "statistic", "value"])
    for row in tidy_rows(report):
        value = row[-1]
        writer.writerow(
            [*row[:-1], "" if isinstance(value, float) and math.isnan(value) else value]
        )
    return buf.getvalue()


def json_ready(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): json_ready(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_ready(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    return x


def as_dict(report: Report) -> dict[str, Any]:
    exps = []
    for exp in report.experiments:
        exps.append(
            {
                "experiment": exp.name,
                "baseline": exp.baseline.label,
                "differing_keys": exp.differing_keys,
                "evaluation": exp.evaluation,
                "metrics": exp.metrics,
                "arms": [
                    {
                        "label": a.label,
                        "preset": a.is_preset,
                        "differences": a.differences,
                        "launched": len(a.runs),
                        "used": len(a.used),
                        "runs": [
                            {
                                "path": str(u.run.path),
                                "seed": u.run.seed,
                                "status": u.run.status,
                                "last_update": u.run.last_update,
                                "wall_s": u.run.wall_s,
                                "used": u.used,
                                "reason": u.reason,
                            }
                            for u in a.uses
                        ],
                    }
                    for a in exp.arms
                ],
                "table": {a: {m: asdict(e) for m, e in t.items()} for a, t in exp.table.items()},
                "per_seed": {
                    a: {m: [asdict(v) for v in vs] for m, vs in t.items()}
                    for a, t in exp.per_seed.items()
                },
                "iqm": {a: {s: asdict(e) for s, e in t.items()} for a, t in exp.iqm.items()},
                "comparisons": {
                    a: {m: asdict(c) for m, c in t.items()} for a, t in exp.comparisons.items()
                },
                "thresholds": [asdict(th) for th in exp.thresholds],
            }
        )
    return json_ready(
        {
            "paths": report.paths,
            "provenance": report.provenance,
            "options": asdict(report.options),
            "experiments": exps,
            "unplaced": [str(r.path) for r in report.unplaced],
        }
    )


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_text_outputs(report: Report, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "report.md": markdown(report),
        "report.csv": csv_text(report),
        "report.json": json.dumps(as_dict(report), indent=1, sort_keys=True) + "\n",
    }
    for name, text in files.items():
        write_atomic(out / name, text)
    return [out / name for name in files]
