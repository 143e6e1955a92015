"""The rollout pool and its parts, one module each:

- `pool`: `RolloutPool`, the lifecycle, the admission loop, batches out and weights in (what a
  run sees), and its checkpoint (in-flight prompts rerun on resume);
- `admission`: the earliest-deadline admission invariant that bounds policy lag, the queue of
  started rollouts, and which finished ones form a batch;
- `rollouts`: one rollout's record (group, versions, trajectory), running it through the agent
  loop, and the checkpoint form of finished-but-unconsumed ones;
- `state`: the prompt cursor (the task sampler with the pool's RNG) and the counters;
- `requeue`: which failures are the engine's, and the prompts they send back into the data
  order (`rollout.max_prompt_retries`);
- `outages`: the engine's outages (no rollout admitted meanwhile), timed, counted and logged
  once;
- `loop_thread`: the background asyncio loop and its bounded stop (`STOP_WAIT_S`);
- `lockstep`: sync mode's gate that makes engine batches independent of timing;
- `metering`: generation time, tokens/s and the learner's wait per batch;
- `pinning`: background work (evaluation) that the next weight push waits for.

Names are imported on first use, so reading one part does not import the rest.
"""

from __future__ import annotations

from frlab.lazy import lazy_exports

_EXPORTS = {
    "RolloutPool": "frlab.rollout.pool.pool",
    "STOP_WAIT_S": "frlab.rollout.pool.loop_thread",
    "admission_feasible": "frlab.rollout.pool.admission",
    "required_early": "frlab.rollout.pool.admission",
    "select_batch": "frlab.rollout.pool.admission",
    "COUNTERS": "frlab.rollout.pool.state",
    "engine_stats": "frlab.rollout.pool.state",
    "REJECT_REASONS": "frlab.rollout.pool.rollouts",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
