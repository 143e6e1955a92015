"""The extending guide's component example (docs/extending.md) works as written: the class is
registered, selected
from the command line with its own hyperparameter, validated, and its diagnostic is logged.

It runs in a subprocess so that the example's registration does not leak into other tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from frlab.objective.catalog import ROOT

GUIDE = ROOT / "docs" / "extending.md"  # holds the marked example

BEGIN, END = "<!-- extending-example:begin", "<!-- extending-example:end -->"

SCRIPT = """
import math
from dataclasses import dataclass

import torch

from frlab.config.compose import compose
from frlab.config.errors import ConfigError
from frlab.config.preflight import preflight
from frlab.learner.metrics import StepMetrics
from frlab.objective import Objective
from frlab.objective.base import (
    TRUST_REGIONS, Diagnostic, TokenBatch, TrustRegion, TrustRegionOutput, hyperparameter,
)

exec(EXAMPLE)

plan = preflight(compose(["objective.trust_region=max_log_ratio",
                          "+objective.max_log_ratio.bound=0.3"]))
assert plan["trust"] == "max_log_ratio bound=0.3", plan["trust"]
try:
    preflight(compose(["objective.trust_region=max_log_ratio",
    "+objective.max_log_ratio.bound=-1"]))
    raise AssertionError("a negative bound passed")
except ConfigError as err:
    assert err.key == "objective.max_log_ratio.bound", err.key

# rho = (0.8, 1) in row 0 (max |log rho| = ln 1.25 = 0.223), (0.5, 1) in row 1 (ln 2 = 0.693)
cur = torch.log(torch.tensor([[0.4, 0.5], [0.25, 0.5]], dtype=torch.float64))
beh = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64))
mask = torch.ones(2, 2, dtype=torch.bool)
objective = Objective(trust_region="max_log_ratio", params={"max_log_ratio": {"bound": 0.3}})
_, diag = objective(cur, beh, objective.advantages(torch.tensor([1.0, 0.0])), mask)
assert diag["admitted"].tolist() == [True, False]
step = StepMetrics(objective)
step.update_diagnostics(diag)
value = step.compute()["train/max_log_ratio/max_abs_log_ratio_mean"]
assert abs(value - (math.log(1.25) + math.log(2.0)) / 2) < 1e-12, value
print("ok")
"""


@pytest.mark.slow
def test_the_readme_example_registers_selects_validates_and_logs() -> None:
    text = GUIDE.read_text()
    block = text[text.index(BEGIN) : text.index(END)]
    example = block.split("```python\n", 1)[1].split("```", 1)[0]
    code = f"EXAMPLE = {example!r}\n" + textwrap.dedent(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
