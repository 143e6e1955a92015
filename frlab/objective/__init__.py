"""The objective of the FlashREINFORCE paper and its swappable components.

Components, one file per kind, each a frozen dataclass registered by a short name (the table
in README.md is generated from the registries): baselines, trust regions, aggregations and
token filters. `Objective` composes one of each; `flashreinforce_loss` is the
reference-compatible function; `sampled_logprobs_and_entropy` turns logits into sampled-token
log-probs and entropies chunk by chunk. To add a component, subclass the kind's base class
from `frlab.objective.base` (its docstring shows a complete example).
"""

from __future__ import annotations

from typing import Any

from frlab.objective.base import (
    AGGREGATIONS,
    BASELINES,
    TOKEN_FILTERS,
    TRUST_REGIONS,
    Aggregation,
    Baseline,
    Component,
    Diagnostic,
    TokenBatch,
    TokenFilter,
    TrustRegion,
    TrustRegionOutput,
    compute_dtype,
    hyperparameter,
)
from frlab.objective.hyperparameters import Hyperparameter, HyperparameterError
from frlab.objective.objective import KINDS, Objective
from frlab.objective.presets import PRESETS
from frlab.objective.reference import flashreinforce_loss

__all__ = [
    "AGGREGATIONS",
    "BASELINES",
    "KINDS",
    "PRESETS",
    "TOKEN_FILTERS",
    "TRUST_REGIONS",
    "Aggregation",
    "Baseline",
    "Component",
    "Diagnostic",
    "Hyperparameter",
    "HyperparameterError",
    "Objective",
    "TokenBatch",
    "TokenFilter",
    "TrustRegion",
    "TrustRegionOutput",
    "compute_dtype",
    "flashreinforce_loss",
    "hyperparameter",
    "sampled_logprobs_and_entropy",
]


def __getattr__(name: str) -> Any:
    """Lazy re-export of the log-prob helper (keeps `import frlab.objective` light)."""
    if name == "sampled_logprobs_and_entropy":
        from frlab.ops.logprobs import sampled_logprobs_and_entropy

        return sampled_logprobs_and_entropy
    raise AttributeError(f"module 'frlab.objective' has no attribute {name!r}")
