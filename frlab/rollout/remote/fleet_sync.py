"""Weight sync of a generation-server fleet shared by several learner ranks (DDP / FSDP).

With W > 1 learner ranks every rank runs its own rollout pool and `RemoteEngine`, all on the
SAME servers (`rollout.remote.servers`). A weight sync changes what those servers serve to
every rank, so `WeightSyncCallback` makes it a collective step (`push_collectively`), in the
phases of the engine's own update (frlab.rollout.remote.weight_sync):

1. every rank stops dispatching (`hold_for_update`; under resubmit an aborted answer is its
   own from here, whichever rank's pause aborted it); barrier;
2. every rank meets its requests in flight as `rollout.weight_update` says
   (`stop_for_update`): drain waits for them, resubmit stops them (`/pause?mode=abort` on
   the servers it has requests on), in_flight freezes every labelled server between two
   decode steps; barrier: from here no request of any rank samples anywhere on the fleet;
3. every rank pushes the weights of `version`. DDP keeps the replicas identical, so the pushes
   are identical: a server loads the first and deduplicates the others by (version,
   fingerprint), answering the same acknowledgement (frlab.serve and the vLLM worker
   extension; a LoRA fleet by the listed adapter, frlab.rollout.remote.lora); each rank still
   checks that acknowledgement against its own fingerprint, so replicas that diverged would be
   an error, not a silent mix;
4. one all-reduce of "my push succeeded" (also the barrier that no rank resumes a server
   before every rank's engine knows the new version): if any rank failed, every rank raises;
5. every rank resumes (`release_update`): the servers it paused go on, and so do its
   resubmitted and frozen requests, their tokens labelled with the new version.

Without 1-2 a rank's request in flight would come back with tokens of a version its engine
does not know yet (refused as stale, retried, failed rollouts), a resubmit pause would abort
another rank's requests as a server fault, and a prober could reload an older snapshot over a
newer one (a held engine admits nothing). Engines that are private to a rank (torch,
in-process vLLM) keep the plain per-rank `pool.update_weights`.
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
    """Hold and stop every rank, push `version` from every rank, agree on success, release
    (see above).

    Every rank must call this at the same point (the callback does, at train start and every
    `sync_every` steps). Raises on EVERY rank if the push failed on any rank."""
    pins = getattr(pool, "pins", None)
    if pins is not None:  # an evaluation in flight needs the engine unpaused to finish
        pins.wait()
    engine = pool.engine
    engine.hold_for_update()
    try:
        strategy.barrier("frlab_fleet_held")
        engine.stop_for_update()
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
        engine.release_update()
    log.debug("fleet weight sync v%d done on this rank", version)
