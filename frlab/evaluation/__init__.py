"""Evaluation during training: avg@k on math benchmarks and on whole agent episodes.

- `AvgAtKEvaluation` (frlab.evaluation.avg_at_k): single-turn replies graded 0/1, the
  FlashREINFORCE paper's avg@k metric (`eval.kind: math`);
- `EpisodeEvaluation` (frlab.evaluation.episodes): k episodes per task of a multi-turn
  environment, e.g. ALFWorld's seen and unseen games (`eval.kind: episodes`);
- `PeriodicEvaluation` (frlab.evaluation.periodic): their shared schedule and publishing;
- `benchmark_specs` / `load_benchmark` (frlab.evaluation.benchmarks): `eval.benchmarks` as
  named specs, and their problems;
- `checks` (frlab.evaluation.checks): what each kind asks of its `eval` node, before a run.

The callbacks need Lightning and are imported lazily; `benchmarks` and `checks` are light
(preflight and the dry-run plan use them).
"""

from __future__ import annotations

from frlab.evaluation.benchmarks import benchmark_specs, load_benchmark
from frlab.lazy import lazy_exports

_LAZY = {
    "AvgAtKEvaluation": "frlab.evaluation.avg_at_k",
    "EpisodeEvaluation": "frlab.evaluation.episodes",
    "PeriodicEvaluation": "frlab.evaluation.periodic",
}

__all__ = [
    "AvgAtKEvaluation",
    "EpisodeEvaluation",
    "PeriodicEvaluation",
    "benchmark_specs",
    "load_benchmark",
]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
