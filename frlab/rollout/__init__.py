"""Rollout side of frlab: engines, the agent loop, the rollout pool and weight sync.

Names are exported lazily so `import frlab.rollout` stays cheap (no torch model code, no
Lightning, never vllm) until one of them is used.
"""

from __future__ import annotations

from frlab.lazy import lazy_exports

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

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
