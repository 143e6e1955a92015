"""The extending guide's setting recipe (docs/extending.md, "A new setting") works as written,
counted in files touched: in a scratch copy of the repository, AMSGrad as one field of
`OptimConfig` plus the regenerated key reference is all that changes; then the key reaches
AdamW from the command line's composition, and a non-boolean value stops a dry run naming it.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.scratch import scratch_copy

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "extending.md"
SCHEMA = "frlab/config/schema.py"
COPIED = ("frlab", "envs", "configs", "experiments", "docs", "README.md", "pyproject.toml")
AFTER = "    eps: float = spec("  # the guide puts the field after `eps`
READS = """
from frlab.config.compose import compose, instantiate
from frlab.config.preflight import check_config
import torch
cfg = compose(["optim.amsgrad=true"])
check_config(cfg)
make = instantiate(cfg.optim, key="optim")
print("amsgrad", make([torch.nn.Parameter(torch.zeros(2))]).defaults["amsgrad"])
"""


def marked(lang: str) -> str:
    text = GUIDE.read_text()
    block = text[text.index("<!-- setting-optim:begin") : text.index("<!-- setting-optim:end")]
    return block.split(f"```{lang}\n", 1)[1].split("```", 1)[0]


def tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def run(root: Path, args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


def add_setting(root: Path) -> set[str]:
    """The recipe in the copy: the field after `eps`, then the guide's command; files changed."""
    before = tree(root)
    schema = root / SCHEMA
    text = schema.read_text()
    at = text.index("\n", text.index(AFTER)) + 1
    while text[at:].startswith("        "):  # the declaration's continuation lines
        at = text.index("\n", at) + 1
    schema.write_text(text[:at] + marked("python") + text[at:])
    for line in marked("bash").splitlines():
        words = shlex.split(line)
        assert words[0] == "python", words
        done = run(root, words[1:])
        assert done.returncode == 0, done.stderr[-3000:]
    after = tree(root)
    assert set(after) == set(before)  # nothing added
    return {p for p in before if after[p] != before[p]}


@pytest.mark.slow
def test_an_optimizer_setting_is_one_field_and_the_regenerated_reference(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path, COPIED)
    assert add_setting(root) == {SCHEMA, "docs/config-keys.md"}
    assert "optim.amsgrad" in (root / "docs/config-keys.md").read_text()
    reads = run(root, ["-c", READS])
    assert reads.returncode == 0 and "amsgrad True" in reads.stdout, reads.stderr[-3000:]
    refused = run(root, ["-m", "frlab", "optim.amsgrad=3", "dry_run=true"])
    assert refused.returncode == 2 and "optim.amsgrad" in refused.stderr, refused.stderr[-3000:]
