"""The learner: the FlashREINFORCE LightningModule, AdamW + schedules, atomic checkpoints.

Names are imported lazily so that `frlab.learner.optim` or `.checkpoint` stay cheap to import.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "FlashReinforceModule": "frlab.learner.module",
    "build_optimizer": "frlab.learner.optim",
    "build_scheduler": "frlab.learner.optim",
    "AtomicCheckpointIO": "frlab.learner.checkpoint",
    "capture_rng_states": "frlab.learner.checkpoint",
    "restore_rng_states": "frlab.learner.checkpoint",
    "StepMetrics": "frlab.learner.metrics",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'frlab.learner' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
