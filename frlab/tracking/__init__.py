"""Run files and progress display: `metrics.csv`, `summary.json`, the training progress bar
(evaluation during training is `frlab.evaluation`).

`RunFilesCallback` and `ProgressBar` need Lightning and are imported lazily; the file helpers (`read_metrics`, `summarize`) come from the Lightning-free
`frlab.tracking.metrics_file`.
"""

from __future__ import annotations

import importlib
from typing import Any

from frlab.tracking.metrics_file import read_metrics, summarize

_LAZY = {
    "RunFilesCallback": "frlab.tracking.run_files",
    "ProgressBar": "frlab.tracking.progress",
}

__all__ = [
    "ProgressBar",
    "RunFilesCallback",
    "read_metrics",
    "summarize",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'frlab.tracking' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
