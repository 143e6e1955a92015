"""Runs into arms: what makes an arm, how it is named, which runs it uses."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.report_runs import make_run

from frlab.report.arms import choose_runs, group_arms, pick_baseline
from frlab.report.runs import ReportError, load_run


def arm_runs(root: Path, name: str, seeds, changes=None, choices=None, overrides=(), **kw):
    return [
        load_run(
            make_run(
                root / f"{name}_{s}",
                seed=s,
                rewards=[0.1, 0.2],
                changes=changes,
                choices=choices,
                overrides=[*overrides, f"seed={s}"],
                **kw,
            )
        )
        for s in seeds
    ]


def test_arms_ignore_the_seed_and_bookkeeping_and_split_experiments(tmp_path: Path) -> None:
    runs = arm_runs(tmp_path, "a", [0, 1], overrides=["paths.log_dir=/x"])
    runs += arm_runs(tmp_path, "b", [0], changes={"paths.log_dir": "/elsewhere", "plots": False})
    runs += arm_runs(tmp_path, "c", [0], experiment="other")
    experiments = group_arms(runs)
    assert sorted(experiments) == ["other", "toy_cpu"]
    (arm,) = experiments["toy_cpu"]
    assert len(arm.runs) == 3 and arm.is_preset and arm.label == "preset"


def test_arms_are_named_by_the_differing_choices(tmp_path: Path) -> None:
    runs = arm_runs(
        tmp_path, "base", [0, 1], choices={"ablation": "base"}, overrides=["ablation=base"]
    )
    runs += arm_runs(
        tmp_path,
        "pg",
        [0, 1],
        changes={"objective.trust_region": "none"},
        choices={"ablation": "pg_is"},
        overrides=["ablation=pg_is"],
    )
    arms = group_arms(runs)["toy_cpu"]
    assert [a.label for a in arms] == ["ablation=base", "ablation=pg_is"]  # preset first
    assert arms[0].is_preset and not arms[1].is_preset
    assert arms[1].differences == {"objective.trust_region": "none"}


def test_without_telling_choices_arms_are_named_by_keys_against_the_preset(tmp_path: Path) -> None:
    runs = arm_runs(tmp_path, "p", [0])
    runs += arm_runs(
        tmp_path,
        "n",
        [0],
        changes={"objective.trust_region": "none"},
        overrides=["objective.trust_region=none"],
    )
    runs += arm_runs(
        tmp_path,
        "g",
        [0],
        changes={"objective.trust_region": "ppo_clip", "objective.baseline": "group_mean"},
        overrides=["objective.trust_region=ppo_clip", "objective.baseline=group_mean"],
    )
    labels = [a.label for a in group_arms(runs)["toy_cpu"]]
    assert labels == [
        "preset",
        "objective.baseline=group_mean, objective.trust_region=ppo_clip",
        "objective.trust_region=none",
    ]


def test_finished_runs_are_used_and_every_other_run_says_why(tmp_path: Path) -> None:
    runs = arm_runs(tmp_path, "f", [0, 1])
    runs += arm_runs(tmp_path, "x", [2], status="failed")
    runs += arm_runs(tmp_path, "k", [3], status=None)
    (arm,) = group_arms(runs)["toy_cpu"]
    choose_runs(arm, include_unfinished=False)
    assert [r.seed for r in arm.used] == [0, 1]
    reasons = {u.run.seed: u.reason for u in arm.uses if not u.used}
    assert reasons[2].startswith("failed") and reasons[3].startswith("running")
    assert arm.header == "preset: 2 used of 4 launched"
    choose_runs(arm, include_unfinished=True)
    assert [r.seed for r in arm.used] == [0, 1, 2, 3]


def test_a_seed_run_twice_counts_once_and_says_which(tmp_path: Path) -> None:
    runs = arm_runs(tmp_path, "first", [0, 1]) + arm_runs(tmp_path, "again", [1])
    (arm,) = group_arms(runs)["toy_cpu"]
    choose_runs(arm, include_unfinished=False)
    assert [r.seed for r in arm.used] == [0, 1]
    (left,) = [u for u in arm.uses if not u.used]
    assert left.reason.startswith("seed 1 twice:")


def test_baseline_by_label_or_part_of_one(tmp_path: Path) -> None:
    runs = arm_runs(tmp_path, "p", [0])
    runs += arm_runs(
        tmp_path,
        "n",
        [0],
        changes={"objective.trust_region": "none"},
        overrides=["objective.trust_region=none"],
    )
    arms = group_arms(runs)["toy_cpu"]
    assert pick_baseline(arms, None).label == "preset"
    assert pick_baseline(arms, "trust_region=none").label == "objective.trust_region=none"
    with pytest.raises(ReportError, match=r"--baseline 'grpo' matches no arm \(arms: preset;"):
        pick_baseline(arms, "grpo")
