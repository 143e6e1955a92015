"""Run folders as the report reads them: where they are, what ran, how far it got.

A run folder is what `python -m frlab` writes: `metrics.csv` (one row per update), `summary.json`
(written when the run ends, with its `status`), and Hydra's `.hydra/` record (`config.yaml`: the
composed config; `hydra.yaml`: the config-group choices; `overrides.yaml`: the command line). A
folder holding any of those at its top is a run; any other folder given is searched below for
runs (a sweep folder, or a folder of sweeps). Only files are read: nothing of training is
imported, so a report starts in a second and works on a machine without torch.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

METRICS_FILE = "metrics.csv"
SUMMARY_FILE = "summary.json"
HYDRA_DIR = ".hydra"
RUN_MARKERS = (METRICS_FILE, SUMMARY_FILE, f"{HYDRA_DIR}/config.yaml")
RUNNING_WITHIN_S = 600.0  # no summary.json and metrics.csv written this recently: still running
# summary.json's status -> the census's words
STATUS_WORDS = {"finished": "finished", "failed": "failed", "interrupted": "killed"}


class ReportError(Exception):
    """Input the report cannot use (exit code 2): the message names the path or option."""


@dataclass
class Run:
    """One run folder: its config, its metric rows (one per update, each step once) and its end."""

    path: Path
    config: dict[str, Any]  # flattened `.hydra/config.yaml`: "objective.trust_region" -> value
    choices: dict[str, Any]  # config-group choices (hydra.runtime.choices) but Hydra's own
    overrides: list[str]
    summary: dict[str, Any] | None
    columns: dict[str, np.ndarray] = field(default_factory=dict)  # metric -> values by step
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0))
    age_s: float = math.inf  # seconds since the run last wrote a file (decides running/killed)
    written_at: float = math.nan  # when it last wrote one (a timestamp: stable across reports)

    @property
    def seed(self) -> int | None:
        seed = self.config.get("seed")
        return int(seed) if isinstance(seed, int | float) and not isinstance(seed, bool) else None

    @property
    def experiment(self) -> str:
        return str(self.choices.get("experiment") or self.config.get("experiment") or "unknown")

    @property
    def status(self) -> str:
        """finished, failed, killed (a signal, or no summary.json long after the last write),
        or running (no summary.json and a recent write)."""
        if self.summary is None:
            return "running" if self.age_s < RUNNING_WITHIN_S else "killed"
        return STATUS_WORDS.get(str(self.summary.get("status")), str(self.summary.get("status")))

    @property
    def status_detail(self) -> str:
        """Why the status is what it is, in a few words."""
        if self.summary is None:
            if math.isnan(self.written_at):
                return f"no {SUMMARY_FILE}"
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.written_at))
            return f"no {SUMMARY_FILE}; last write {when}"
        detail = [str(self.summary.get("signal") or ""), str(self.summary.get("error") or "")]
        return "; ".join(d for d in detail if d)[:120]

    def update_rows(self) -> np.ndarray:
        """Indices of the training rows (step >= 1; a step-0 row holds only an evaluation)."""
        return np.flatnonzero(self.steps >= 1)

    @property
    def last_update(self) -> int:
        rows = self.update_rows()
        return int(self.steps[rows[-1]]) if rows.size else 0

    @property
    def wall_s(self) -> float:
        """Seconds of training to the last written row (`elapsed_s`; summary.json's if none)."""
        elapsed = self.columns.get("elapsed_s")
        if elapsed is not None and np.isfinite(elapsed).any():
            return float(np.nanmax(elapsed))
        wall = (self.summary or {}).get("wall_time_s")
        return float(wall) if isinstance(wall, int | float) else math.nan


def is_run(folder: Path) -> bool:
    return any((folder / marker).is_file() for marker in RUN_MARKERS)


def find_runs(paths: Sequence[str | Path]) -> list[Path]:
    """The run folders at or below each path, in order, each once; a path that holds no run is
    a ReportError naming it."""
    found: list[Path] = []
    for path in map(Path, paths):
        if not path.exists():
            raise ReportError(f"{path}: no such folder")
        if not path.is_dir():
            raise ReportError(f"{path}: not a folder (give a run folder or a sweep folder)")
        runs = [path] if is_run(path) else _runs_below(path)
        if not runs:
            markers = ", ".join(RUN_MARKERS)
            raise ReportError(f"{path}: no run folder in it or below it (none holds {markers})")
        found += runs
    return list(dict.fromkeys(p.resolve() for p in found))


def _runs_below(folder: Path) -> list[Path]:
    """Outermost run folders below `folder` (a run's own subfolders are not runs)."""
    runs: list[Path] = []
    for child in sorted(p for p in folder.iterdir() if p.is_dir() and p.name != HYDRA_DIR):
        runs += [child] if is_run(child) else _runs_below(child)
    return runs


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`; lists stay values (a benchmark list is one value)."""
    if not isinstance(node, Mapping):
        return {prefix: node} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in node.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def _yaml(path: Path) -> Any:
    if not path.is_file():
        return None
    with path.open() as fh:
        return yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def read_columns(path: Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """metrics.csv as (steps, {column: values}) with one row per step, in step order: where a
    step appears twice (rows a resume wrote again), the later row is kept."""
    if not path.is_file():
        return np.zeros(0), {}
    with path.open(newline="") as fh:
        header = next(csv.reader(fh), [])
        body = fh.read().replace("\r\n", "\n")  # csv's own line ends
    if "step" not in header:
        return np.zeros(0), {}
    table = _table(body, len(header))
    steps = table[:, header.index("step")]
    keep = np.isfinite(steps)
    _, last = np.unique(steps[keep][::-1], return_index=True)  # the last row of each step
    order = np.flatnonzero(keep)[::-1][last]
    order = order[np.argsort(steps[order], kind="stable")]
    columns = {name: table[order, j] for j, name in enumerate(header) if name and name != "step"}
    return steps[order], columns


EMPTY_CELL = re.compile(r"(?<![^,\n])(?=,|\n|$)")  # a cell with nothing in it


def _table(body: str, width: int) -> np.ndarray:
    """The rows of a CSV body as floats, empty cells NaN: numpy's C parser for a well-formed
    file, a cell-by-cell pass for one with text or ragged rows (a row cut by a crash)."""
    if not body.strip():
        return np.zeros((0, width))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            text = EMPTY_CELL.sub("nan", body.rstrip("\n"))
            table = np.loadtxt(io.StringIO(text), delimiter=",", ndmin=2)
        if table.shape[1] == width:
            return table
    except ValueError:
        pass
    rows = [row for row in csv.reader(io.StringIO(body)) if row]
    table = np.full((len(rows), width), np.nan)
    for i, row in enumerate(rows):
        for j, cell in enumerate(row[:width]):
            table[i, j] = _float(cell) if cell else np.nan
    return table


def _float(cell: str) -> float:
    try:
        return float(cell)
    except ValueError:
        return math.nan


def load_run(path: Path, now: float | None = None) -> Run:
    """Read one run folder (any of its files may be missing: an older or a killed run)."""
    config = _yaml(path / HYDRA_DIR / "config.yaml")
    hydra = _yaml(path / HYDRA_DIR / "hydra.yaml") or {}
    choices = ((hydra.get("hydra") or {}).get("runtime") or {}).get("choices") or {}
    summary = None
    if (path / SUMMARY_FILE).is_file():
        try:
            summary = json.loads((path / SUMMARY_FILE).read_text())
        except json.JSONDecodeError as exc:
            raise ReportError(f"{path / SUMMARY_FILE}: not JSON ({exc})") from exc
    steps, columns = read_columns(path / METRICS_FILE)
    written = [p.stat().st_mtime for p in (path / METRICS_FILE, path / SUMMARY_FILE) if p.exists()]
    age = (now or time.time()) - max(written) if written else math.inf
    written_at = max(written) if written else math.nan
    return Run(
        path=path,
        config=flatten(config) if isinstance(config, Mapping) else {},
        choices={k: v for k, v in choices.items() if not str(k).startswith("hydra")},
        overrides=[str(o) for o in (_yaml(path / HYDRA_DIR / "overrides.yaml") or [])],
        summary=summary if isinstance(summary, dict) else None,
        columns=columns,
        steps=steps,
        age_s=age,
        written_at=written_at,
    )


def load_runs(paths: Iterable[Path]) -> list[Run]:
    now = time.time()
    return [load_run(p, now) for p in paths]
