"""`python -m frlab.report` end to end on run folders made by hand: every robustness case in one
sweep, the outputs, their reproducibility and the exit codes."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from helpers.report_runs import make_run

from frlab.report.__main__ import main
from frlab.report.plots import aligned_by_update
from frlab.report.runs import load_run

pytest.importorskip("rliable", reason="the report extra (rliable) is not installed")

EVAL = "eval/heldout/avg@4"


def sweep(root: Path) -> Path:
    """Arm `ablation=base` (preset): seeds 0-4 finished, seed 5 failed, seed 6 killed; arm
    `ablation=pg_is`: seeds 0-2, of 10, 8 and 6 updates, the last from an older frlab without
    the acceptance rate."""
    for seed in range(7):
        status = {5: "failed", 6: None}.get(seed, "finished")
        make_run(
            root / f"ablation=base,seed={seed}",
            seed=seed,
            choices={"ablation": "base"},
            overrides=["ablation=base", f"seed={seed}"],
            rewards=[0.1 * seed] * 10,
            evals={EVAL: [(0, 0.2, 0.05), (10, 0.5 + 0.05 * seed, 0.04)]},
            columns={"train/acceptance_rate": [0.9] * 10},
            status=status,
        )
    for seed, updates in ((0, 10), (1, 8), (2, 6)):
        make_run(
            root / f"ablation=pg_is,seed={seed}",
            seed=seed,
            choices={"ablation": "pg_is"},
            overrides=["ablation=pg_is", f"seed={seed}"],
            rewards=[0.2] * updates,
            changes={"objective.trust_region": "none"},
            evals={EVAL: [(0, 0.2, 0.05), (updates, 0.4, 0.04)]},
            columns={} if seed == 2 else {"train/acceptance_rate": [1.0] * updates},
        )
    return root


def test_the_report_of_a_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = sweep(tmp_path / "sweep")
    assert main([str(root), "--threshold", "train/reward_mean=0.25", "--reps", "2000"]) == 0
    out = root / "report"
    md = (out / "report.md").read_text()
    printed = capsys.readouterr().out
    assert "ablation=base: 5 used of 7 launched" in md and "ablation=pg_is: 3 used of 3" in md
    assert "| ablation=base | 5 | failed |" in md and "| ablation=base | 6 | running |" in md
    assert "no: failed" in md and "no: running (no summary.json; last write" in md
    assert re.search(
        r"\| ablation=base \(baseline\) \| 5 of 7 \| 0\.600 \[0\.5\d\d, 0\.6\d\d\] \|", md
    )
    assert "| ablation=pg_is | 3 of 3 | 0.400 (0.400-0.400) ‡ |" in md
    assert "1.000 (1.000-1.000) ‡ (1 without it)" in md  # the older run's missing metric
    assert "**Warning**: the arms' last evaluations are at different updates" in md
    assert (
        "| ablation=pg_is | eval/heldout/avg@4 | -0.200 ‡ |" in md and "paired, 3 seeds" not in md
    )
    assert "**unpaired** (3 vs 5)" in md  # seeds 0-2 against 0-4
    assert "| ablation=base | 2 of 5 | not reached by half the runs |" in md  # seeds 3, 4 only
    assert "ablation=base (baseline) | 5 of 7 | 0.600 [" in printed
    rows = list(csv.DictReader((out / "report.csv").open()))
    seeds = {
        r["statistic"]: r["value"]
        for r in rows
        if r["arm"] == "ablation=base" and r["metric"] == EVAL
    }
    assert seeds["seed=4"] == "0.7" and seeds["method"] == "bootstrap" and seeds["n"] == "5"
    data = json.loads((out / "report.json").read_text())
    (exp,) = data["experiments"]
    assert exp["baseline"] == "ablation=base" and exp["differing_keys"] == [
        "objective.trust_region"
    ]
    pngs = sorted(p.name for p in (out / "toy_cpu").iterdir())
    assert pngs == [
        "intervals.png",
        "threshold_train_reward_mean.png",
        "train_acceptance_rate.png",
        "train_reward_mean.png",
    ]


def test_the_same_runs_give_the_same_report(tmp_path: Path) -> None:
    root = sweep(tmp_path / "sweep")
    texts = []
    for name in ("one", "two"):
        assert main([str(root), "--out", str(tmp_path / name), "--no-plots", "--reps", "500"]) == 0
        texts.append([(tmp_path / name / f).read_text() for f in ("report.csv", "report.json")])
    assert texts[0] == texts[1]


def test_include_unfinished_uses_their_last_window(tmp_path: Path) -> None:
    root = sweep(tmp_path / "sweep")
    assert main([str(root), "--include-unfinished", "--no-plots", "--reps", "500"]) == 0
    md = (root / "report" / "report.md").read_text()
    assert "ablation=base: 7 used of 7 launched" in md


def test_runs_of_unequal_length_align_by_update_with_their_seed_count(tmp_path: Path) -> None:
    root = sweep(tmp_path / "sweep")
    runs = [load_run(root / f"ablation=pg_is,seed={s}") for s in range(3)]
    x, grid = aligned_by_update(runs, "train/reward_mean")
    assert x.tolist() == list(range(1, 11))
    assert (~(grid != grid)).sum(axis=0).tolist() == [3] * 6 + [2] * 2 + [1] * 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["EMPTY"], "EMPTY: no run folder in it or below it"),
        (["SWEEP", "--baseline", "grpo"], "--baseline 'grpo' matches no arm"),
    ],
)
def test_bad_input_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    (tmp_path / "EMPTY").mkdir()
    sweep(tmp_path / "SWEEP")
    argv = [str(tmp_path / a) if a in ("EMPTY", "SWEEP") else a for a in args]
    assert main([*argv, "--no-plots"]) == 2
    assert message in capsys.readouterr().err


def test_a_malformed_threshold_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([".", "--threshold", "train/reward_mean"])
    assert exc.value.code == 2
    assert "--threshold 'train/reward_mean': expected METRIC=VALUE" in capsys.readouterr().err
