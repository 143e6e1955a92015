"""Weight sync of a generation-server fleet shared by several learner ranks (DDP / FSDP).

With W > 1 learner ranks every rank runs its own rollout pool and `RemoteEngine`, all on the
SAME servers (`rollout.remote.servers`). A weight sync changes what those servers serve to
every rank, so `WeightSyncCallback` makes it a collective step (`push_collectively`):

1. every rank stops dispatching and waits for its own in-flight requests (`engine.pause()`);
2. barrier: from here no request of any rank is in flight anywhere on the fleet;
3. every rank pushes the weights of `version`. DDP keeps the replicas identical, so the pushes
   are identical: a server loads the first and deduplicates the others by (version,
   fingerprint), answering the same acknowledgement (frlab.serve and the vLLM worker
   extension); each rank still checks that acknowledgement against its own fingerprint, so
   replicas that diverged would be an error, not a silent mix;
4. one all-reduce of "my push succeeded": if any rank failed, every rank raises;
5. every rank resumes.

Without 1-2 a rank's request in flight would come back with tokens of a version its engine
does not know yet (refused as stale, retried, failed rollouts), and its prober could reload
its older snapshot over a newer one. Engines that are private to a rank (torch, in-process
vLLM) keep the plain per-rank `pool.update_weights`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)


def shares_fleet(trainer: Any, pool: Any) -> bool:
    """True when several ranks drive one server fleet (engine flag `shared_across_ranks`)."""
    engine = getattr(pool, "engine", None)
    shared = bool(getattr(engine, "shared_across_ranks", False))
    return shared and int(getattr(trainer, "world_size", 1)) > 1


def push_collectively(
    strategy: Any, pool: Any, state_dict: Mapping[str, Any], version: int
) -> None:
    """Drain every rank, push `version` from every rank, agree on success, resume (see above).

    Every rank must call this at the same point (the callback does, at train start and every
    `sync_every` steps). Raises on EVERY rank if the push failed on any rank."""
    pins = getattr(pool, "pins", None)
    if pins is not None:  # an evaluation in flight needs the engine unpaused to finish
        pins.wait()
    engine = pool.engine
    engine.pause()
    try:
        strategy.barrier("frlab_fleet_drained")
        error: BaseException | None = None
        try:
            pool.update_weights(state_dict, version)
        except Exception as exc:  # reported to the other ranks before it is raised
            error = exc
        if not strategy.reduce_boolean_decision(error is None, all=True):
            if error is not None:
                raise error
            raise RuntimeError(
                f"weight sync of version {version} to the shared rollout fleet failed on "
                "another learner rank (see that rank's log)"
            )
    finally:
        engine.resume()
    log.debug("fleet weight sync v%d done on this rank", version)
