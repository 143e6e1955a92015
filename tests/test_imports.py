"""`import frlab` (and its light submodules) must never import vllm, alfworld or wandb."""

import subprocess
import sys

import pytest

FORBIDDEN = ("vllm", "alfworld", "wandb")


@pytest.mark.slow
@pytest.mark.parametrize(
    "module",
    [
        "frlab",
        "frlab.objective",
        "frlab.data",
        "frlab.model",
        "frlab.rollout",
        "frlab.learner",
        "envs",
    ],
)
def test_import_does_not_pull_optional_heavy_packages(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"{module} imported {out.stdout.strip()}"
