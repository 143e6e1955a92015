"""Run files and progress display: `metrics.csv`, `summary.json`, the training progress bar
(evaluation during training is `frlab.evaluation`).

`RunFilesCallback` and `ProgressBar` need Lightning and are imported lazily; the file helpers
(`read_metrics`, `summarize`) come from the Lightning-free
`frlab.tracking.metrics_file`.
"""

from __future__ import annotations

from frlab.lazy import lazy_exports
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

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
