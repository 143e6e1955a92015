"""The policy model: building/loading/saving HF causal LMs and chunked LM-head log-probs.

Exports are imported lazily, so `import frlab.model` does not import transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "build_policy": "frlab.model.policy",
    "save_policy": "frlab.model.policy",
    "tiny_config": "frlab.model.policy",
    "ModelNotCachedError": "frlab.model.policy",
    "logprobs_from_hidden": "frlab.model.lm_logprobs",
    "sequence_logprobs": "frlab.model.lm_logprobs",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'frlab.model' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
