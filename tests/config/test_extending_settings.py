"""The extending guide's setting recipes (docs/extending.md, "A new setting") work as written,
counted in files touched, in one scratch copy of the repository: AMSGrad as one field of
`OptimConfig` plus the regenerated key reference is all that changes, the key reaches AdamW from
the command line's composition, and a non-boolean value stops a dry run naming it; a fleet
deadline is one field of `RemoteConfig`, the remote engine's parameter that uses it and the
regenerated reference, it reaches the engine built as a run builds it, and a value out of its
range stops a dry run naming it.
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
ENGINE = "frlab/rollout/remote/engine.py"
FLEET_READS = """
from frlab.config.arguments import declared_arguments
from frlab.config.compose import compose, instantiate
from frlab.config.preflight import check_config
from frlab.config.schema import ModelConfig
from frlab.model.policy import build_policy
cfg = compose(["rollout=remote", "rollout.remote.servers=[http://127.0.0.1:9]",
               "rollout.remote.connect_timeout_s=2.5"])
check_config(cfg)
model = declared_arguments(ModelConfig, name_or_path=None, config={"model_type": "qwen2",
    "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_key_value_heads": 1})
engine = instantiate(cfg.rollout.engine, key="rollout.engine")(
    policy=build_policy(**model, seed=0), seed=0)
print("connect_timeout_s", engine.connect_timeout_s)
"""
READS = """
from frlab.config.compose import compose, instantiate
from frlab.config.preflight import check_config
import torch
cfg = compose(["optim.amsgrad=true"])
check_config(cfg)
make = instantiate(cfg.optim, key="optim")
print("amsgrad", make([torch.nn.Parameter(torch.zeros(2))]).defaults["amsgrad"])
"""


def marked(name: str) -> tuple[list[str], list[str]]:
    """The guide's `setting-NAME` recipe: its python blocks and its bash commands, in order."""
    text = GUIDE.read_text()
    block = text[text.index(f"<!-- setting-{name}:begin") : text.index(f"<!-- setting-{name}:end")]
    code = {"python": [], "bash": []}
    for part in block.split("```")[1::2]:
        lang, body = part.split("\n", 1)
        code[lang].append(body)
    assert code["python"] and code["bash"], name
    return code["python"], [line for body in code["bash"] for line in body.splitlines()]


def inserted(path: Path, after: str, lines: str) -> None:
    """`lines` inserted in `path` after the statement that starts with the line holding `after`
    (through the line that closes its brackets)."""
    text = path.read_text()
    start = text.rindex("\n", 0, text.index(after)) + 1
    at = text.index("\n", start) + 1
    while text.count("(", start, at) > text.count(")", start, at):
        at = text.index("\n", at) + 1
    path.write_text(text[:at] + lines + text[at:])


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


def follow(root: Path, name: str, places: list[tuple[str, str]]) -> set[str]:
    """The guide's `name` recipe in the copy: each python block inserted at its place (a file
    and the line it follows), then the recipe's commands; the files that changed."""
    before = tree(root)
    blocks, commands = marked(name)
    assert len(blocks) == len(places), name
    for body, (rel, after) in zip(blocks, places, strict=True):
        inserted(root / rel, after, body)
    for line in commands:
        words = shlex.split(line)
        assert words[0] == "python", words
        done = run(root, words[1:])
        assert done.returncode == 0, done.stderr[-3000:]
    after = tree(root)
    assert set(after) == set(before)  # nothing added
    return {p for p in before if after[p] != before[p]}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One scratch copy for both recipes (each counts only its own changes)."""
    return scratch_copy(tmp_path_factory.mktemp("settings"), COPIED)


@pytest.mark.slow
def test_an_optimizer_setting_is_one_field_and_the_regenerated_reference(root: Path) -> None:
    assert follow(root, "optim", [(SCHEMA, "    eps: float = spec(")]) == {
        SCHEMA,
        "docs/config-keys.md",
    }
    assert "optim.amsgrad" in (root / "docs/config-keys.md").read_text()
    reads = run(root, ["-c", READS])
    assert reads.returncode == 0 and "amsgrad True" in reads.stdout, reads.stderr[-3000:]
    refused = run(root, ["-m", "frlab", "optim.amsgrad=3", "dry_run=true"])
    assert refused.returncode == 2 and "optim.amsgrad" in refused.stderr, refused.stderr[-3000:]


@pytest.mark.slow
def test_a_fleet_setting_is_one_field_its_parameter_and_the_regenerated_reference(
    root: Path,
) -> None:
    places = [
        (SCHEMA, "    request_timeout_s: float = spec("),
        (ENGINE, "        request_timeout_s: float,"),
        (ENGINE, "        self.max_retries = int(max_retries)"),
    ]
    assert follow(root, "fleet", places) == {SCHEMA, ENGINE, "docs/config-keys.md"}
    assert "rollout.remote.connect_timeout_s" in (root / "docs/config-keys.md").read_text()
    reads = run(root, ["-c", FLEET_READS])
    assert reads.returncode == 0, reads.stderr[-3000:]
    assert "connect_timeout_s 2.5" in reads.stdout
    command = ["-m", "frlab", "rollout=remote", "rollout.remote.servers=[http://127.0.0.1:9]"]
    refused = run(root, [*command, "rollout.remote.connect_timeout_s=0", "dry_run=true"])
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "rollout.remote.connect_timeout_s" in refused.stderr
