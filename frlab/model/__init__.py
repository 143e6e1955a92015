"""The policy model: building/loading/saving HF causal LMs and chunked LM-head log-probs.

Exports are imported lazily, so `import frlab.model` does not import transformers.
"""

from __future__ import annotations

from frlab.lazy import lazy_exports

_EXPORTS = {
    "build_policy": "frlab.model.policy",
    "save_policy": "frlab.model.policy",
    "tiny_config": "frlab.model.policy",
    "ModelNotCachedError": "frlab.model.policy",
    "logprobs_from_hidden": "frlab.model.lm_head",
    "sequence_logprobs": "frlab.model.lm_logprobs",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
