"""The FlashREINFORCE objective and its swappable components (SPEC §2).

Components, one file per kind, each registered by a short name:
baselines (`batch_mean`, `none`, `batch_mean_std`, `group_mean`, `group_mean_std`, `rloo`),
trust regions (`sequence_bernoulli_kl`, `none`, `no_is`, `token_bernoulli_kl`, `sequence_k3`,
`geometric_ratio`, `token_tis`, `ppo_clip`), aggregations (`sample_mean`, `token_mean`,
`constant_length`) and token filters (`none`, `entropy_failures`). `Objective` composes one of
each; `flashreinforce_loss` is the reference-compatible function; `sampled_logprobs_and_entropy`
turns logits into sampled-token log-probs and entropies chunk by chunk.
"""

from __future__ import annotations

from typing import Any

from frlab.objective.base import (
    AGGREGATIONS,
    BASELINES,
    TOKEN_FILTERS,
    TRUST_REGIONS,
    TrustRegionOutput,
    compute_dtype,
)
from frlab.objective.objective import KINDS, PRESETS, Objective
from frlab.objective.reference import flashreinforce_loss

__all__ = [
    "AGGREGATIONS",
    "BASELINES",
    "KINDS",
    "PRESETS",
    "TOKEN_FILTERS",
    "TRUST_REGIONS",
    "Objective",
    "TrustRegionOutput",
    "compute_dtype",
    "flashreinforce_loss",
    "sampled_logprobs_and_entropy",
]


def __getattr__(name: str) -> Any:
    """Lazy re-export of the log-prob helper (keeps `import frlab.objective` light)."""
    if name == "sampled_logprobs_and_entropy":
        from frlab.ops.logprobs import sampled_logprobs_and_entropy

        return sampled_logprobs_and_entropy
    raise AttributeError(f"module 'frlab.objective' has no attribute {name!r}")
