"""The extending guide's engine recipe (docs/extending.md, "A new rollout engine") works as
written, both ways, each counted in files touched:

- in tree: the example class in one new folder, `frlab/rollout/naive/`, and its option file
  `configs/rollout/engine/naive.yaml`, written into a scratch copy of the repository; the
  guide's command regenerates the key reference. Three files are added and one regenerated,
  nothing else changes; the layering, engine-option and docs checks pass in the copy,
  preflight asks the class for its modes, and `python -m frlab rollout/engine=naive` trains;
- out of tree: the class in a package of the user's (on PYTHONPATH, nothing names it to frlab),
  and an option file in a config folder of the user's (two files, beside the package's empty
  `__init__.py`); the guide's own command trains the CPU default with behaviour log-probs equal
  to the learner's.

Subprocesses run the copy's code (its root first on PYTHONPATH, run from its root), so nothing
here touches this checkout.
"""

from __future__ import annotations

import csv
import hashlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.scratch import scratch_copy

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "extending.md"  # holds the marked example
MODULE, OPTION = "mypkg/engine.py", "myconfigs/rollout/engine/naive.yaml"  # named by the guide
FOLDER, IN_TREE_OPTION = "frlab/rollout/naive", "configs/rollout/engine/naive.yaml"
TARGET = "frlab.rollout.naive.engine.NaiveEngine.for_policy"
# What the in-tree recipe's run and the checks it must pass read.
COPIED = (
    "frlab",
    "envs",
    "configs",
    "experiments",
    "docs",
    "bench",
    "scripts",
    ".ci",
    "README.md",
    "pyproject.toml",
    "tests/conftest.py",
    "tests/helpers",
    "tests/test_layers.py",
    "tests/test_repo_hygiene.py",
    "tests/config/test_schema.py",
    "tests/config/test_group_options.py",
)
CHECKS = [
    "tests/test_layers.py",
    "tests/config/test_schema.py",
    "tests/config/test_group_options.py",
    "tests/test_repo_hygiene.py",
]


def marked(name: str) -> dict[str, str]:
    """The fenced code of the guide's block marked `name`, by language (one block each)."""
    text = GUIDE.read_text()
    block = text[text.index(f"<!-- {name}:begin") : text.index(f"<!-- {name}:end -->")]
    out = {}
    for lang in ("python", "yaml", "bash"):
        if f"```{lang}\n" in block:
            assert block.count(f"```{lang}\n") == 1, f"one {lang} block in {name}"
            out[lang] = block.split(f"```{lang}\n", 1)[1].split("```", 1)[0]
    return out


def run(cwd: Path, args: list[str], path: Path | None = None) -> subprocess.CompletedProcess:
    """`args` in `cwd`, with `path` (the scratch copy or the user's folder) first on PYTHONPATH."""
    first = [str(path)] if path is not None else []
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([*first, os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def frlab(cwd: Path, overrides: list[str], path: Path | None = None) -> subprocess.CompletedProcess:
    return run(cwd, [sys.executable, "-m", "frlab", *overrides], path)


def trained(run_dir: Path) -> list[dict[str, str]]:
    """The metrics rows of a finished run, checked: three steps, the learner's log-probs."""
    with (run_dir / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("step")]
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    assert float(rows[0]["train/sequence_kl_mean"]) < 1e-6  # its log-probs are the learner's
    return rows


# --- in tree ------------------------------------------------------------------------------------


def tree(root: Path) -> dict[str, str]:
    """Every file under `root` (no caches) -> its content's hash."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def add_in_tree(root: Path) -> tuple[set[str], set[str]]:
    """The guide's in-tree recipe in the copy at `root`: (files added, files changed)."""
    text = GUIDE.read_text()
    for path in (f"{FOLDER}/", f"{FOLDER}/engine.py", IN_TREE_OPTION, "`__init__.py`"):
        assert path in text, f"the guide no longer names {path}"
    before = tree(root)
    (root / FOLDER).mkdir()
    (root / FOLDER / "__init__.py").write_text('"""The naive engine: one forward per token."""\n')
    (root / FOLDER / "engine.py").write_text(marked("engine-example")["python"])
    (root / IN_TREE_OPTION).write_text(marked("engine-in-tree")["yaml"])
    for line in marked("engine-in-tree")["bash"].splitlines():
        words = shlex.split(line)
        assert words[0] == "python", words
        done = run(root, [sys.executable, *words[1:]], root)
        assert done.returncode == 0, done.stderr[-3000:]
    after = tree(root)
    changed = {p for p in before if after.get(p) != before[p]}
    return set(after) - set(before), changed


@pytest.mark.slow
def test_an_engine_in_tree_is_one_folder_and_its_option_file(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path, COPIED)
    added, changed = add_in_tree(root)
    assert added == {f"{FOLDER}/__init__.py", f"{FOLDER}/engine.py", IN_TREE_OPTION}, added
    assert changed == {"docs/config-keys.md"}, changed  # regenerated, not written by hand
    assert "naive" in (root / "docs/config-keys.md").read_text()
    every = ["-m", ""]  # the slow checks too (the default leaves them out)
    checks = run(
        root, [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", *every, *CHECKS], root
    )
    assert checks.returncode == 0, checks.stdout[-4000:]
    assert "python -m frlab rollout/engine=naive" in GUIDE.read_text()
    plan = frlab(root, ["rollout/engine=naive", "dry_run=true"], root)
    assert plan.returncode == 0 and TARGET in plan.stdout, plan.stdout + plan.stderr[-3000:]
    refused = frlab(
        root, ["rollout/engine=naive", "dry_run=true", "rollout.weight_update=in_flight"], root
    )
    assert refused.returncode == 2 and "rollout.weight_update" in refused.stderr, refused.stderr
    out = frlab(
        root,
        [
            "rollout/engine=naive",
            "trainer.max_steps=3",
            "rollout.max_in_flight=16",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        root,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert all(float(r["train/acceptance_rate"]) > 0.9 for r in trained(tmp_path / "run"))


# --- out of tree --------------------------------------------------------------------------------


def out_of_tree(folder: Path, *overrides: str) -> subprocess.CompletedProcess:
    """The guide's files under `folder` (two, and the package's empty `__init__.py`), then its
    command with `overrides` added."""
    text, code = GUIDE.read_text(), marked("engine-out-of-tree")
    for path in (MODULE, OPTION, "mypkg/__init__.py"):
        assert f"`{path}`" in text, f"the guide no longer names {path}"
    written = {
        "mypkg/__init__.py": "",
        MODULE: marked("engine-example")["python"],
        OPTION: code["yaml"],
    }
    for rel, content in written.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(content)
    files = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
    assert files == set(written), files  # nothing of frlab's is touched
    [line] = [ln for ln in code["bash"].splitlines() if "python -m frlab" in ln]
    words = shlex.split(line.replace("$PWD", str(folder)))
    assert words[0] == "PYTHONPATH=" + str(folder) and words[1:4] == ["python", "-m", "frlab"]
    return frlab(folder, [*words[4:], *overrides], folder)


@pytest.mark.slow
def test_the_guides_engine_out_of_tree_trains_through_python_m_frlab(tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    out = out_of_tree(
        user, "trainer.max_steps=3", "rollout.max_in_flight=16", f"hydra.run.dir={tmp_path / 'run'}"
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert all(float(r["train/acceptance_rate"]) > 0.9 for r in trained(tmp_path / "run"))


@pytest.mark.slow
def test_preflight_asks_the_out_of_tree_engine_class_for_its_modes(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plan = out_of_tree(tmp_path / "a", "dry_run=true")
    assert plan.returncode == 0, plan.stderr[-4000:]
    assert "mypkg.engine.NaiveEngine.for_policy" in plan.stdout
    refused = out_of_tree(tmp_path / "b", "dry_run=true", "rollout.weight_update=in_flight")
    assert refused.returncode == 2 and "rollout.weight_update" in refused.stderr, refused.stderr[
        -2000:
    ]
