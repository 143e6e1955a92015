"""Rollout side of frlab: the shared core, the rollout pool, and one folder per engine backend.

The core, one module each: `engine` (the `Engine` interface, `SamplingParams`,
`GenerationResult`, the capabilities an engine class declares), `weight_modes` (the
`rollout.weight_update` modes and the steps of them the backends share), `engine_loop` (an
engine's own event loop), `agent_loop`, `chat`, `env_threads`, `deadlines`, `seeding` and
`callbacks` (the weight push, collective for an engine shared across ranks). `pool` is the
rollout pool; the backends are `torch` (in-process and child-process torch engines), `vllm`
(everything that knows vLLM's API) and `remote` (the HTTP fleet client, which may import
`vllm`). The core imports no backend; a run imports only the backend its `rollout.engine`
names.

Names are exported lazily so `import frlab.rollout` stays cheap (no torch model code, no
Lightning, never vllm) until one of them is used.
"""

from __future__ import annotations

from frlab.lazy import lazy_exports

_EXPORTS = {
    "Engine": "frlab.rollout.engine",
    "EngineDown": "frlab.rollout.engine",
    "EngineError": "frlab.rollout.engine",
    "EngineFault": "frlab.rollout.engine",
    "Outage": "frlab.rollout.engine",
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
