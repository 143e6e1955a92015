"""Run folders as `python -m frlab` writes them, made by hand for the report's tests.

`make_run` writes `.hydra/config.yaml`, `.hydra/hydra.yaml` (the group choices),
`.hydra/overrides.yaml`, `metrics.csv` (a step-0 evaluation row, then one row per update) and,
unless `status=None` (a killed or running run), `summary.json` with that status.
"""

from __future__ import annotations

import copy
import csv
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

BASE_CONFIG: dict[str, Any] = {
    "seed": 0,
    "dry_run": False,
    "plots": True,
    "paths": {"log_dir": "outputs", "output_dir": "${hydra:runtime.output_dir}"},
    "objective": {
        "baseline": "batch_mean",
        "trust_region": "sequence_bernoulli_kl",
        "sequence_bernoulli_kl": {"delta": 0.003},
    },
    "trainer": {"max_steps": 10},
    "eval": {
        "k": 4,
        "limit": 50,
        "sampling": {"temperature": 1.0, "top_p": 1.0},
        "benchmarks": [{"name": "heldout"}, {"name": "transfer"}],
    },
    "callbacks": {"samples": {"path": "${paths.output_dir}/samples.jsonl"}},
}


def set_key(config: dict[str, Any], key: str, value: Any) -> None:
    node = config
    *parents, last = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def make_run(
    folder: Path,
    *,
    seed: int,
    rewards: Sequence[float],
    changes: Mapping[str, Any] | None = None,
    choices: Mapping[str, Any] | None = None,
    overrides: Sequence[str] | None = None,
    evals: Mapping[str, Sequence[tuple[int, float, float]]] | None = None,
    columns: Mapping[str, Sequence[float]] | None = None,
    seconds_per_update: float = 2.0,
    status: str | None = "finished",
    experiment: str = "toy_cpu",
    rows_again: Sequence[int] = (),
) -> Path:
    """One run folder. `changes`: flat config keys set on BASE_CONFIG; `choices`: the arm's
    group choices; `evals`: metric -> [(step, value, se)]; `columns`: more per-update metrics;
    `rows_again`: steps whose row is written a second time (as a resumed run's file has them,
    the first copy holding a stale reward of -1)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(BASE_CONFIG)
    config["seed"] = seed
    for key, value in (changes or {}).items():
        set_key(config, key, value)
    hydra_dir = folder / ".hydra"
    hydra_dir.mkdir(exist_ok=True)
    (hydra_dir / "config.yaml").write_text(yaml.safe_dump(config))
    all_choices = {
        "experiment": experiment,
        "objective": "flashreinforce",
        "hydra/launcher": "basic",
        **(choices or {}),
    }
    (hydra_dir / "hydra.yaml").write_text(
        yaml.safe_dump({"hydra": {"runtime": {"choices": all_choices}}})
    )
    listed = list(overrides if overrides is not None else [f"seed={seed}"])
    (hydra_dir / "overrides.yaml").write_text(yaml.safe_dump(listed))
    write_metrics(folder, rewards, evals or {}, columns or {}, seconds_per_update, rows_again)
    if status is not None:
        summary = {
            "status": status,
            "steps": len(rewards),
            "wall_time_s": seconds_per_update * len(rewards),
            "frlab": {"commit": "abc123", "dirty": False, "version": "0.1.0"},
        }
        (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def write_metrics(
    folder: Path,
    rewards: Sequence[float],
    evals: Mapping[str, Sequence[tuple[int, float, float]]],
    columns: Mapping[str, Sequence[float]],
    seconds_per_update: float,
    rows_again: Sequence[int],
) -> None:
    rows: dict[int, dict[str, Any]] = {}
    for step, reward in enumerate(rewards, start=1):
        row = {"step": step, "elapsed_s": seconds_per_update * step, "train/reward_mean": reward}
        for name, values in columns.items():
            if step - 1 < len(values):
                row[name] = values[step - 1]
        rows[step] = row
    for metric, points in evals.items():
        for step, value, se in points:
            row = rows.setdefault(step, {"step": step, "elapsed_s": seconds_per_update * step})
            row[metric] = value
            if not math.isnan(se):
                row[metric + "_se"] = se
    ordered = [rows[s] for s in sorted(rows)]
    for step in rows_again:  # a resume wrote these steps once more: the first copy is stale
        stale = dict(rows[step], **{"train/reward_mean": -1.0})
        at = ordered.index(rows[step])
        ordered.insert(at, stale)
    names = ["step", "elapsed_s"] + sorted({k for r in ordered for k in r} - {"step", "elapsed_s"})
    with (folder / "metrics.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=names, restval="")
        writer.writeheader()
        writer.writerows(ordered)
