"""Single-turn math with a verifiable 0/1 reward.

Public entry points: `grade(response, ground_truth) -> float` (answer extraction, string
match, then math-verify in worker processes: safe from rollout threads), `extract_answer`,
`MathEnv` (the environment), `TEMPLATES` (its prompt templates, envs.math.templates),
`load_math_dataset` (local JSONL/parquet, Hugging Face ids, offline package sources),
`evaluate_avg_at_k` (avg@k per benchmark). They are imported on first use, so that a light
submodule (`envs.math.templates`) can be read without the rest; math-verify (extra `math`)
and the data packages (extra `data`) are imported only when used.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "MathDataset": "envs.math.datasets",
    "load_math_dataset": "envs.math.datasets",
    "MathEnv": "envs.math.env",
    "TEMPLATES": "envs.math.templates",
    "benchmark_avg_at_k": "envs.math.evaluate",
    "evaluate_avg_at_k": "envs.math.evaluate",
    "extract_answer": "envs.math.extract",
    "answers_match": "envs.math.grading",
    "grade": "envs.math.grading",
    "ground_truth_text": "envs.math.grading",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'envs.math' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
