"""The extending guide's recipes carried out on a scratch copy of the repository: the guide's
marked blocks, its commands, and running the copy's code (shared by the recipe tests)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from helpers.scratch import scratch_copy as copy_repo

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "extending.md"
SECTION = ("## A new objective component", "## A new environment")
# What the recipe's steps, commands and tests read.
COPIED = (
    "frlab",
    "envs",
    "configs",
    "experiments/experiment",
    "experiments/sweep",
    "tests/conftest.py",
    "tests/helpers",
    "tests/objective",
    "tests/generated",
    "docs/config-keys.md",
    "README.md",
    "pyproject.toml",
)
LOOP_FILE = "tests/helpers/objective_loops.py"


def section() -> str:
    text = GUIDE.read_text()
    return text[text.index(SECTION[0]) : text.index(SECTION[1])]


def marked(name: str) -> str:
    """The python code of the guide's block marked `<!-- NAME:begin ... -->`."""
    text = section()
    block = text[text.index(f"<!-- {name}:begin") : text.index(f"<!-- {name}:end -->")]
    return "\n\n" + block.split("```python\n", 1)[1].split("```", 1)[0]


def recipe_commands() -> list[list[str]]:
    """The commands of the recipe's bash block, run with this python."""
    block = section().split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split() for line in block.splitlines() if line.strip()]
    assert all(c[0] == "python" for c in commands), commands
    return [[sys.executable, *c[1:]] for c in commands]


def scratch_copy(tmp_path: Path) -> Path:
    # Not the recipe tests (they would run themselves), nor the one that registers the guide's
    # example in a fresh process: the copy's trust_regions.py holds it (registered twice).
    return copy_repo(tmp_path, COPIED, skip=("test_extending*.py",))


def run(root: Path, args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def append(root: Path, rel: str, code: str) -> None:
    path = root / rel
    path.write_text(path.read_text() + code)


def frlab(root: Path, *overrides: str) -> subprocess.CompletedProcess:
    return run(root, [sys.executable, "-m", "frlab", *overrides])


def digests(root: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under `root` (caches left out)."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def touched(before: dict[str, str], after: dict[str, str]) -> set[str]:
    """Files added, changed or removed between two `digests`."""
    return {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
