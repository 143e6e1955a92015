"""Run files and progress display: `metrics.csv`, `summary.json`, the training progress bar."""

from frlab.tracking.progress import ProgressBar
from frlab.tracking.run_files import RunFilesCallback, read_metrics, summarize

__all__ = ["ProgressBar", "RunFilesCallback", "read_metrics", "summarize"]
