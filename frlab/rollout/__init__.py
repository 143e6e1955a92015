"""Rollout side of frlab: engines, the agent loop, the rollout pool and weight sync.

Names are exported lazily so `import frlab.rollout` stays cheap (no torch model code, no
Lightning, never vllm) until one of them is used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Engine": "frlab.rollout.engine",
    "EngineDown": "frlab.rollout.engine",
    "EngineError": "frlab.rollout.engine",
    "GenerationResult": "frlab.rollout.engine",
    "SamplingParams": "frlab.rollout.engine",
    "AgentLoopConfig": "frlab.rollout.agent_loop",
    "RolloutError": "frlab.rollout.agent_loop",
    "run_episode": "frlab.rollout.agent_loop",
    "RolloutPool": "frlab.rollout.pool",
    "WeightSyncCallback": "frlab.rollout.callbacks",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'frlab.rollout' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
