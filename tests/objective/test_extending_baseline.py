"""The extending guide's baseline recipe (docs/extending.md, "A new baseline"), carried out on a
scratch copy of the repository and counted in files.

The copy gets the guide's group-median baseline, its hand-computed test and its per-row
reference (the guide's marked blocks), then the guide's commands regenerate the derived files
and run the objective tests. Exactly the three edited files and the regenerated ones change;
preflight refuses the group baseline at one sample per prompt (its `is_group`), and the CPU
default trains with it at four.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from helpers.recipe import (
    LOOP_FILE,
    append,
    digests,
    frlab,
    marked,
    recipe_commands,
    run,
    scratch_copy,
    touched,
)

EDITED = {"frlab/objective/baselines.py", "tests/objective/test_baselines.py", LOOP_FILE}
REGENERATED = {"README.md", "docs/config-keys.md"}  # no hyperparameters: no defaults to write


@pytest.mark.slow
def test_the_baseline_recipe_touches_three_files_and_regenerates_two(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path)
    before = digests(root)
    append(root, "frlab/objective/baselines.py", marked("extending-baseline"))
    append(root, "tests/objective/test_baselines.py", marked("extending-baseline-test"))
    append(root, LOOP_FILE, marked("extending-baseline-reference"))
    catalog, tests = recipe_commands()
    wrote = run(root, catalog)
    assert wrote.returncode == 0, wrote.stderr[-3000:]
    assert touched(before, digests(root)) == EDITED | REGENERATED
    assert "`group_median`" in (root / "README.md").read_text()  # the component table
    ran = run(root, [*tests, "-v"], timeout=600)
    assert ran.returncode == 0, ran.stdout[-6000:]
    assert "test_group_median_hand_values PASSED" in ran.stdout
    assert "test_advantages_match_loop[group_median] PASSED" in ran.stdout

    # a group baseline: refused at one sample per prompt, named by the key
    single = frlab(root, "dry_run=true", "objective.baseline=group_median")
    assert single.returncode == 2, single.stdout + single.stderr
    assert "rollout.samples_per_prompt" in single.stderr, single.stderr
    run_dir = tmp_path / "run"
    trained = frlab(
        root,
        "objective.baseline=group_median",
        "rollout.samples_per_prompt=4",
        "trainer.max_steps=2",
        f"hydra.run.dir={run_dir}",
    )
    assert trained.returncode == 0, trained.stderr[-4000:]
    with (run_dir / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("step")]
    assert [int(r["step"]) for r in rows] == [1, 2]
    assert all(math.isfinite(float(r["train/loss"])) for r in rows)
