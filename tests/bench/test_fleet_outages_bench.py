"""bench/fleet_outages.py: what it reads from a run folder (updates, dropped and requeued
prompts, outages, the log lines that tell faults) and the table row it prints."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest
from helpers.bench import load_bench

fleet_outages = load_bench("fleet_outages")

LOG = [
    "[2026-12-05 10:00:00,000][frlab.rollout.remote.engine][INFO] - remote engine: weights v5 "
    "on 1 server",
    "[2026-12-05 10:00:01,000][frlab.rollout.remote.engine][WARNING] - remote engine: server "
    "http://127.0.0.1:1 down (connection refused)",
    "[2026-12-05 10:00:01,100][frlab.rollout.pool.outages][WARNING] - rollout fleet down (...)",
    "[2026-12-05 10:00:31,100][frlab.rollout.pool.outages][INFO] - rollout fleet down for 30 s",
    "[2026-12-05 10:01:01,000][frlab.rollout.remote.engine][INFO] - remote engine: server "
    "http://127.0.0.1:1 back after 60 s",
    "[2026-12-05 10:01:02,000][frlab.rollout.remote.engine][INFO] - remote engine: weights v6 "
    "on 1 server",
]


def run_folder(tmp_path: Path) -> Path:
    run = tmp_path / "restart"
    run.mkdir()
    (run / "metrics.csv").write_text("step,train/loss\n1,0.5\n2,0.4\n3,0.3\n")
    (run / "frlab.log").write_text("\n".join(LOG) + "\n")
    stats = {
        "failed": 0,
        "failed_by_reason": {},
        "requeued": 64,
        "requeued_by_reason": {"engine": 64},
        "outages": {"count": 1, "longest_s": 61.4, "total_s": 61.4},
    }
    (run / "summary.json").write_text(json.dumps({"status": "finished", "rollout_stats": stats}))
    return run


def test_the_outcome_counts_updates_prompts_outages_and_the_lines_that_tell_faults(
    tmp_path: Path,
) -> None:
    run = run_folder(tmp_path)
    got = fleet_outages.outcome(run, 0)
    assert got["updates"] == 3 and got["status"] == "finished" and got["exit"] == 0
    assert got["failed"] == 0 and got["requeued_by_reason"] == {"engine": 64}
    assert got["log_lines"] == 6 and got["weight_sync_lines"] == 2
    assert got["fault_lines"] == 4  # down, fleet down, still down, back; not the two syncs
    first_two = len(("\n".join(LOG[:2]) + "\n").encode())
    assert fleet_outages.outcome(run, 0, log_from=first_two)["log_lines"] == 4


def test_a_row_reads_as_the_documented_table(tmp_path: Path) -> None:
    got = {"case": "restart", **fleet_outages.outcome(run_folder(tmp_path), 0)}
    row = fleet_outages.row(got, Namespace(updates=150))
    size = len(("\n".join(LOG) + "\n").encode()) / 1024
    assert row == (
        "| restart | exit 0, 3/150 | 0 | 64 (`engine` 64) | 1, longest 61 s | "
        f"6 lines (4 on faults), {size:.0f} KiB |"
    )


def test_an_unknown_case_is_refused_by_name() -> None:
    with pytest.raises(SystemExit, match="flap"):
        fleet_outages.main(["--cases", "restart,flap"])
