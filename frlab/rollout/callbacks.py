"""`WeightSyncCallback`: keep the rollout engine's weights and version in step with the learner.

The FlashREINFORCE paper measures policy lag as the learner version at the update minus the
version that sampled each token, so the engine must carry the learner's version. The learner
module exposes `policy` (the trained model) and `policy_version` (completed optimizer steps).
After every `sync_every` optimizer steps this callback pushes `policy.state_dict()` to the pool
(`pool.update_weights(state_dict, version)`: the engine pauses, loads, bumps its version,
resumes, and the pool checks the version it reports); on other steps it only tells the pool the
learner version. It also syncs once at train start, so a resumed run's engine starts from the
restored weights and version. With several learner ranks on one shared engine (an engine
class that declares `shared_across_ranks`: the `remote` engine's server fleet) every push is a
collective step (`push_collectively`, below). Keep `sync_every <= rollout.max_policy_lag`, or
the pool's admission control can never admit new rollouts.

A collective push, in the phases of the engine's own update (the remote engine's:
frlab.rollout.remote.weight_sync):

1. every rank stops dispatching (`hold_for_update`; under resubmit an aborted answer is its
   own from here, whichever rank's pause aborted it); barrier;
2. every rank meets its requests in flight as `rollout.weight_update` says
   (`stop_for_update`: drain waits for them, resubmit stops them, in_flight freezes them
   between two decode steps); barrier: from here no request of any rank samples anywhere;
3. every rank pushes the weights of `version`. DDP keeps the replicas identical, so the pushes
   are identical: the engine loads the first and deduplicates the others by (version,
   fingerprint); each rank still checks the acknowledgement against its own fingerprint, so
   replicas that diverged would be an error, not a silent mix;
4. one all-reduce of "my push succeeded" (also the barrier that no rank resumes before every
   rank's engine knows the new version): if any rank failed, every rank raises;
5. every rank resumes (`release_update`), its stopped and frozen requests going on with tokens
   labelled with the new version.

Without 1-2 a rank's request in flight would come back with tokens of a version its engine
does not know yet, and a resubmit pause would abort another rank's requests as a fault.
Engines private to a rank (torch, in-process vLLM) keep the plain per-rank
`pool.update_weights`.

After every training batch it also logs the rollout pool's counters and the engine's own
(`rollout_metrics`), so they reach every logger and metrics.csv: `rollout/paused_for_lag`,
`rollout/lag_violations`, `rollout/failed`, `rollout/rejected`, `rollout/requeued` (prompts an
engine fault sent back to run again) and per reason `rollout/failed/<reason>`,
`rollout/rejected/<reason>`, `rollout/requeued/<reason>`, and `rollout/fleet_down_s` (seconds
the engine's fleet had no healthy server, the outage under way included) (totals of the run,
restored on resume; with several ranks, the logged row is rank 0's pool), then the engine
counters from
`pool.stats()["engine"]` as `rollout/<name>` (the remote backend: `rollout/retries`,
`rollout/servers_healthy`, ...; engines without counters log none). The pool's generation
window of the batch (`timing/generation_s`, `timing/generation_tokens_per_s`,
`timing/batch_wait_s`: frlab.rollout.pool.metering) is logged the same way.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

import lightning as L

from frlab.errors import ConfigError

log = logging.getLogger(__name__)


class WeightSyncCallback(L.Callback):
    """Push learner weights to the rollout pool every `sync_every` optimizer steps
    (`rollout.sync_every`)."""

    def __init__(self, sync_every: int, pool: Any = None) -> None:
        if int(sync_every) < 1:
            raise ConfigError("rollout.sync_every", f"must be >= 1, got {sync_every}")
        self.sync_every = int(sync_every)
        self._pool = pool
        self._last_seen: int | None = None
        self.syncs = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._push(trainer, pl_module, _version(pl_module))

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self._log_engine_metrics(trainer, pl_module)
        version = _version(pl_module)
        if version == self._last_seen:
            return  # no optimizer step this batch (gradient accumulation)
        if version % self.sync_every == 0:
            self._push(trainer, pl_module, version)
        else:
            self._pool_of(trainer).set_learner_version(version)
            self._last_seen = version

    def _log_engine_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        stats = getattr(self._pool_of(trainer), "stats", None)
        metrics = rollout_metrics(stats()) if callable(stats) else {}
        step_log = getattr(
            pl_module, "step_log", None
        )  # FlashReinforceModule: frlab.learner.step_log
        if metrics and step_log is not None:
            step_log.add(trainer, metrics)
        elif metrics:
            pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)

    def _push(self, trainer: L.Trainer, pl_module: L.LightningModule, version: int) -> None:
        policy = getattr(pl_module, "policy", None)
        if policy is None:
            raise AttributeError("WeightSyncCallback needs the learner module's `policy` model")
        from frlab.learner.sharding import full_state_dict  # FSDP2: gather the shards
        from frlab.model.lora import adapter_state_dict, is_peft

        pool, state_dict = self._pool_of(trainer), full_state_dict(policy)
        if is_peft(policy):  # LoRA: the base never changes, only the adapters travel
            state_dict = adapter_state_dict(state_dict)
        if shares_fleet(trainer, pool):  # ranks share one server fleet: a collective sync
            push_collectively(trainer.strategy, pool, state_dict, version)
        else:
            pool.update_weights(state_dict, version)
        self._last_seen = version
        self.syncs += 1

    def _pool_of(self, trainer: L.Trainer) -> Any:
        if self._pool is not None:
            return self._pool
        pool = getattr(getattr(trainer, "datamodule", None), "pool", None)
        if pool is None:
            raise RuntimeError(
                "WeightSyncCallback found no rollout pool: pass pool=... or train with a "
                "RolloutDataModule (trainer.datamodule.pool)"
            )
        return pool


POOL_COUNTERS = (
    "paused_for_lag",
    "lag_violations",
    "failed",
    "rejected",
    "straggler_stalls",
    "env_deadline_s",
    "engine_deadline_s",
    "requeued",
    "fleet_down_s",
)


def rollout_metrics(stats: Any) -> dict[str, float]:
    """`rollout/<name>` floats of a pool's `stats()`: its counters (POOL_COUNTERS, and failed
    and rejected rollouts and requeued prompts per reason) and the engine's numeric counters;
    plus the last batch's generation window (`timing/generation_s`, ...,
    frlab.rollout.pool.metering)."""
    if not isinstance(stats, dict):
        return {}
    out = {f"rollout/{k}": float(stats[k]) for k in POOL_COUNTERS if _number(stats.get(k))}
    for kind in ("failed", "rejected", "requeued"):
        for reason, count in (stats.get(f"{kind}_by_reason") or {}).items():
            out[f"rollout/{kind}/{_metric_part(reason)}"] = float(count)
    engine = stats.get("engine")
    if isinstance(engine, dict):
        out.update({f"rollout/{k}": float(v) for k, v in engine.items() if _number(v)})
    generation = stats.get("generation")
    if isinstance(generation, dict):
        out.update({k: float(v) for k, v in generation.items() if _number(v)})
    return out


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _metric_part(reason: Any) -> str:
    """A reason as one metric-name segment: letters, digits, `_`, `.`, `-` (others -> `_`)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(reason))


def _version(pl_module: L.LightningModule) -> int:
    version = getattr(pl_module, "policy_version", None)
    if version is None:
        raise AttributeError("WeightSyncCallback needs the learner module's int `policy_version`")
    return int(version)


def shares_fleet(trainer: Any, pool: Any) -> bool:
    """True when several ranks drive one engine (its class declares `shared_across_ranks`)."""
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
