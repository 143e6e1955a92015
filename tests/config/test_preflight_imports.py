"""Preflight asks the chosen engine class what it supports without importing transformers:
the torch engines' modules import it only where they build a cache or a packed mask."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from frlab.config.compose import REPO_ROOT

HEAVY = ("transformers", "lightning", "vllm", "datasets", "peft")


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [[], ["rollout/engine=torch_process"], ["experiment=smollm2_arith_cpu"]],
    ids=["torch", "torch_process", "smollm2_arith_cpu"],
)
def test_preflight_of_a_torch_engine_imports_no_heavy_library(overrides: list[str]) -> None:
    code = (
        "import sys\n"
        "from frlab.config.compose import compose\n"
        "from frlab.config.preflight import preflight\n"
        f"plan = preflight(compose({overrides!r}))\n"
        "assert plan['rollout.engine'] in ('torch', 'torch_process'), plan['rollout.engine']\n"
        f"print('HEAVY', [m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "HEAVY []" in out.stdout, out.stdout
