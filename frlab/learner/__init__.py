"""The learner: the FlashREINFORCE LightningModule, AdamW + schedules, atomic checkpoints.

Names are imported lazily so that `frlab.learner.optim` or `.checkpoint` stay cheap to import.
"""

from __future__ import annotations

from frlab.lazy import lazy_exports

_EXPORTS = {
    "FlashReinforceModule": "frlab.learner.module",
    "LearnerSettings": "frlab.learner.settings",
    "build_scheduler": "frlab.learner.optim",
    "AtomicCheckpointIO": "frlab.learner.checkpoint",
    "capture_rng_states": "frlab.learner.checkpoint",
    "restore_rng_states": "frlab.learner.checkpoint",
    "StepMetrics": "frlab.learner.metrics",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
