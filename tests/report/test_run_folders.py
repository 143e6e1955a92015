"""Reading run folders: where runs are, a resumed run's rows, a run's status."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from helpers.report_runs import make_run

from frlab.report.runs import ReportError, find_runs, load_run


def test_a_sweep_folder_and_a_folder_of_sweeps_give_their_runs(tmp_path: Path) -> None:
    for sweep in ("a", "b"):
        for seed in (0, 1):
            make_run(tmp_path / sweep / f"seed={seed}", seed=seed, rewards=[0.1, 0.2])
    (tmp_path / "a" / "report").mkdir()  # a report written into a sweep folder is no run
    assert len(find_runs([tmp_path])) == 4
    assert [p.name for p in find_runs([tmp_path / "a"])] == ["seed=0", "seed=1"]
    assert find_runs([tmp_path / "a" / "seed=1"]) == [(tmp_path / "a" / "seed=1").resolve()]
    assert len(find_runs([tmp_path / "a", tmp_path / "a" / "seed=0"])) == 2  # each run once


def test_a_folder_without_a_run_is_an_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(ReportError, match=r"empty: no run folder in it or below"):
        find_runs([tmp_path / "empty"])
    with pytest.raises(ReportError, match=r"nowhere: no such folder"):
        find_runs([tmp_path / "nowhere"])


def test_a_resumed_run_counts_each_step_once_the_later_row_kept(tmp_path: Path) -> None:
    run = load_run(
        make_run(tmp_path / "r", seed=0, rewards=[0.1, 0.2, 0.3, 0.4], rows_again=[2, 3])
    )
    assert run.steps.tolist() == [1, 2, 3, 4]
    assert run.columns["train/reward_mean"].tolist() == [0.1, 0.2, 0.3, 0.4]  # not the -1s


def test_a_step_zero_evaluation_row_is_not_an_update(tmp_path: Path) -> None:
    folder = make_run(
        tmp_path / "r",
        seed=0,
        rewards=[0.5] * 3,
        evals={"eval/x/avg@4": [(0, 0.2, 0.1), (3, 0.6, 0.1)]},
    )
    run = load_run(folder)
    assert run.steps.tolist() == [0, 1, 2, 3] and run.update_rows().tolist() == [1, 2, 3]
    assert run.last_update == 3 and np.isnan(run.columns["train/reward_mean"][0])


@pytest.mark.parametrize(
    ("status", "word"), [("finished", "finished"), ("failed", "failed"), ("interrupted", "killed")]
)
def test_status_from_summary(tmp_path: Path, status: str, word: str) -> None:
    assert load_run(make_run(tmp_path / "r", seed=0, rewards=[0.1], status=status)).status == word


def test_no_summary_is_running_when_recent_else_killed(tmp_path: Path) -> None:
    folder = make_run(tmp_path / "r", seed=0, rewards=[0.1, 0.2], status=None)
    assert load_run(folder).status == "running"
    old = time.time() - 3600
    os.utime(folder / "metrics.csv", (old, old))
    run = load_run(folder)
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(old))
    assert run.status == "killed" and run.status_detail == f"no summary.json; last write {stamp}"


def test_an_older_run_without_hydra_record_or_metrics_reads(tmp_path: Path) -> None:
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "summary.json").write_text('{"status": "finished", "wall_time_s": 12.0}')
    run = load_run(folder)
    assert run.config == {} and run.seed is None and run.last_update == 0 and run.wall_s == 12.0


def test_metrics_csv_with_crlf_empty_cells_text_and_a_row_cut_by_a_crash(tmp_path: Path) -> None:
    folder = make_run(tmp_path / "r", seed=0, rewards=[0.1])
    text = "step,elapsed_s,train/reward_mean,eval/x/avg@4\r\n1,2.0,,0.5\r\n2,4.0,oops,\r\n3,6.0"
    (folder / "metrics.csv").write_text(text)
    run = load_run(folder)
    assert run.steps.tolist() == [1, 2, 3]
    assert run.columns["elapsed_s"].tolist() == [2.0, 4.0, 6.0]
    assert np.isnan(run.columns["train/reward_mean"]).all()  # empty, text, missing
    assert run.columns["eval/x/avg@4"][0] == 0.5 and np.isnan(run.columns["eval/x/avg@4"][1:]).all()
