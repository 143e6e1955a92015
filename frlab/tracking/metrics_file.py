"""The run files' formats without Lightning: reading metrics.csv, summarising it, atomic JSON.

Kept free of Lightning so that `python -m frlab.plot` and analysis scripts start fast.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.csv"
SUMMARY_FILE = "summary.json"
PREFIXES = ("train/", "timing/")
FIXED_COLUMNS = ("step", "elapsed_s")


def scalar_metrics(
    metrics: Mapping[str, Any], prefixes: Sequence[str] = PREFIXES
) -> dict[str, float]:
    """Scalar metrics under `prefixes` as floats; `name_step` -> `name`, `name_epoch` dropped."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if not key.startswith(tuple(prefixes)) or key.endswith("_epoch"):
            continue
        name = key[: -len("_step")] if key.endswith("_step") else key
        try:
            out[name] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, float]]:
    """Rows of a metrics.csv as dicts of floats (empty cells -> NaN)."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.exists():
        return []
    with path.open(newline="") as fh:
        return [{k: _to_float(v) for k, v in row.items() if k} for row in csv.DictReader(fh)]


def _to_float(text: str | None) -> float:
    try:
        return float(text) if text not in (None, "") else math.nan
    except ValueError:
        return math.nan


def csv_cells(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row for csv: integer step; NaN (a metric not logged at that step) -> empty cell."""
    out = {k: "" if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}
    if isinstance(out.get("step"), float):
        out["step"] = int(out["step"])
    return out


def _mean(values: Sequence[float]) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def _column(rows: Sequence[Mapping[str, float]], key: str) -> list[float]:
    return [r.get(key, math.nan) for r in rows]


def evaluation_summary(rows: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """Per `eval/` metric, its first and last measurement and their steps (before/after
    training when the run evaluates at step 0 and at its last step)."""
    out: dict[str, Any] = {}
    names = sorted({k for row in rows for k in row if k.startswith("eval/")})
    for name in names:
        points = [(r["step"], r[name]) for r in rows if math.isfinite(r.get(name, math.nan))]
        if points:
            (first_step, first), (last_step, last) = points[0], points[-1]
            out[name] = {
                "first_step": int(first_step),
                "first": first,
                "last_step": int(last_step),
                "last": last,
            }
    return out


def summarize(rows: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """Statistics of a run's metric rows (first/last windows named by their length); a row
    of step 0 (an evaluation before the first update) counts only for `eval`."""
    evaluation = evaluation_summary(rows)
    rows = [r for r in rows if not r.get("step", 1.0) < 1]
    reward = _column(rows, "train/reward_mean")
    accept = _column(rows, "train/acceptance_rate")
    lag_max = [v for v in _column(rows, "train/policy_lag_max") if math.isfinite(v)]
    elapsed = [v for v in _column(rows, "elapsed_s") if math.isfinite(v)]
    wall = max(elapsed) if elapsed else 0.0
    steps = int(rows[-1]["step"]) if rows else 0
    return {
        "steps": steps,
        "rows": len(rows),
        "reward_mean_first_10": _mean(reward[:10]),
        "reward_mean_last_10": _mean(reward[-10:]),
        "reward_mean_last_20": _mean(reward[-20:]),
        "acceptance_rate_mean": _mean(accept),
        "acceptance_rate_last_10": _mean(accept[-10:]),
        "policy_lag_mean": _mean(_column(rows, "train/policy_lag_mean")),
        "policy_lag_max": max(lag_max) if lag_max else None,
        "response_tokens_mean_last_10": _mean(_column(rows, "train/response_tokens_mean")[-10:]),
        "wall_time_s": wall,
        "updates_per_minute": (60.0 * len(rows) / wall) if wall > 0 else None,
        "eval": evaluation,
    }


def write_json_atomic(path: Path, payload: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
