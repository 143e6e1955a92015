"""The extending guide's environment recipe (docs/extending.md, "A new environment") works as
written, counted in files: its example environment and option file, written into a package and
a config folder of the user's exactly as the guide lays them out, are two files beside the
package's empty `__init__.py` and nothing else (as the guide says; a file more in the guide's
example, named or fenced, fails here), and they train the CPU default for a few updates through
the guide's own `python -m frlab` line, the package only on PYTHONPATH, with rewards in the
environment's range."""

from __future__ import annotations

import csv
import os
import random
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "extending.md"  # holds the marked example
SECTION = ("## A new environment", "## A new rollout engine")
BEGIN, END = "<!-- env-example:begin", "<!-- env-example:end -->"
MODULE, OPTION = "mypkg/largest.py", "myconf/env/largest_digit.yaml"  # where the guide puts them
INIT = "mypkg/__init__.py"  # empty
FILES = {INIT, MODULE, OPTION}  # all the recipe writes
NUMBERS = ("no", "one", "two", "three", "four", "five")  # how the guide counts its files
RUNS = ("outputs", "run")  # the folders the runs below write (a dry run's, hydra.run.dir)
REWARDS = (0.0, 0.25, 1.0)  # what one episode of the example can earn


def section() -> str:
    text = GUIDE.read_text()
    return text[text.index(SECTION[0]) : text.index(SECTION[1])]


def fences(block: str) -> list[str]:
    """The languages of the fenced blocks of `block`, in order."""
    return re.findall(r"^```(\S+)$", block, re.M)


def example() -> dict[str, str]:
    """The marked block's fenced code, by language: python (the module), yaml (the option
    file), bash (the command); a fence of any other language fails."""
    text = section()
    block = text[text.index(BEGIN) : text.index(END)]
    langs = fences(block)
    assert sorted(langs) == ["bash", "python", "yaml"], f"the marked example's fences: {langs}"
    return {lang: block.split(f"```{lang}\n", 1)[1].split("```", 1)[0] for lang in langs}


def user_files(folder: Path) -> set[str]:
    """The files under `folder` (relative), caches and the runs' folders left out."""
    paths = (p.relative_to(folder) for p in folder.rglob("*") if p.is_file())
    return {str(p) for p in paths if p.parts[0] not in RUNS and "__pycache__" not in p.parts}


def write_example(folder: Path) -> list[str]:
    """The guide's files under `folder`, counted as the guide counts them; returns its
    command's `python -m frlab` overrides."""
    code, text = example(), section()
    named = set(re.findall(r"`((?:mypkg|myconf)/[^`\s]+)`", text))  # files, not `mypkg/`
    assert named == FILES, f"the guide's environment recipe names {sorted(named)}"
    stated = f"{NUMBERS[len(code) - 1]} files beside an empty `{INIT}`"  # the fences but bash
    assert stated in " ".join(text.split()), f"the guide does not say {stated!r}"
    written = {INIT: "", MODULE: code["python"], OPTION: code["yaml"]}
    for rel, content in written.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(content)
    assert user_files(folder) == FILES, user_files(folder)
    [line] = [ln for ln in code["bash"].splitlines() if "python -m frlab" in ln]
    words = shlex.split(line.replace("$PWD", str(folder)))
    assert words[0] == f"PYTHONPATH={folder}" and words[1:4] == ["python", "-m", "frlab"], words
    return words[4:]


def frlab(folder: Path, *overrides: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "frlab", *overrides],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_env_recipe_is_two_files_beside_an_empty_init(tmp_path: Path) -> None:
    overrides = write_example(tmp_path)
    assert len(FILES) == 3 and (tmp_path / INIT).read_text() == ""
    # the package is found on PYTHONPATH: the command names only the config folder and option
    assert overrides == [f"hydra.searchpath=[file://{tmp_path}/myconf]", "env=largest_digit"]


def test_the_example_env_opens_episodes_and_grades_replies() -> None:
    namespace: dict = {}
    exec(compile(example()["python"], MODULE, "exec"), namespace)  # noqa: S102 - the guide's code
    env_cls = namespace["LargestDigitEnv"]
    sampler = env_cls.task_sampler(size=4)
    task = sampler.sample(random.Random(0))
    assert len(task["digits"]) == 4 and all(0 <= d <= 9 for d in task["digits"])
    env = env_cls(size=4)
    [message] = env.reset({"digits": [3, 8, 1, 8]})
    assert message == {"role": "user", "content": "largest: 3 8 1 8"}
    assert [env.step(reply).reward for reply in ("8", " 8!", "3", "x", "")] == [1, 1, 0.25, 0, 0]
    assert env.step("8").done and env.step("8").observation is None
    with pytest.raises(ValueError, match="env.size"):
        env_cls(size=0)


@pytest.mark.slow
def test_the_guides_env_trains_through_python_m_frlab(tmp_path: Path) -> None:
    overrides = write_example(tmp_path)
    plan = frlab(tmp_path, *overrides, "dry_run=true", "env.size=5")
    assert plan.returncode == 0, plan.stderr[-4000:]
    text = " ".join(plan.stdout.split())  # the plan's column width follows its longest label
    assert "env : mypkg.largest.LargestDigitEnv" in text, plan.stdout
    run = tmp_path / "run"
    out = frlab(
        tmp_path,
        *overrides,
        "trainer.max_steps=3",
        "rollout.max_in_flight=16",
        f"hydra.run.dir={run}",
    )
    assert out.returncode == 0, out.stderr[-4000:]
    with (run / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("step")]
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    batch = 64  # the CPU default's data.batch_size: each row averages 64 episodes
    for row in rows:
        mean = float(row["train/reward_mean"])
        assert 0.0 <= mean <= 1.0, row
        assert abs(mean * batch * 4 - round(mean * batch * 4)) < 1e-6, mean  # a sum of quarters
    assert "mypkg.largest.LargestDigitEnv" in (run / ".hydra" / "config.yaml").read_text()
    assert user_files(tmp_path) == FILES  # the runs wrote only their own folders
