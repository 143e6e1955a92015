"""`RolloutDataModule`: the rollout pool as a Lightning data source of `RolloutBatch`es.

FlashREINFORCE's learner (paper, Sec. 3) takes the next B finished trajectories, makes one update
and never replays them. The DataModule starts a `RolloutPool` in `setup`, and its train
dataloader yields one collated `RolloutBatch` per optimizer step, each row carrying its policy
lag (`infos[i]["policy_lag_min"/"policy_lag_max"]`, `"learner_version"`). The loader is built
with `batch_size=None` and `num_workers=0` (the pool already yields whole batches, in this
process) and reports a length of `trainer.max_steps` batches: a sized loader stops Lightning
from pre-fetching the next batch before the current optimizer step and weight sync, which
would add one version of lag and, in sync mode, collect a batch before the update it must
follow (collect, then train). Once the last planned batch is handed out the pool starts no
more rollouts (`close_admission`).

Teardown stops the pool (a bounded wait: hung environment threads are abandoned), also when
training raises (Lightning calls `on_exception`, not `teardown`, on that path). While it waits
for a batch the stream checks, twice a second, whether SIGINT/SIGTERM asked the run to stop
(`frlab.stop`): the learner is then between two steps, the one safe point for a final
checkpoint. A wait longer than a minute is logged with the pool's counters, unless the pool's
engine is in an outage (`outage_s`), which the pool tells in its own lines. The pool's state is
part of the checkpoint (`state_dict`), so Lightning's warning that a mid-epoch resume has a
non-resumable dataloader does not apply and is filtered.

Distributed data parallel: each rank runs its own pool and engine and consumes B/W
trajectories of the global batch B. `pool_factory` is called with per-rank keyword arguments
`batch_size=B // W, seed=seed + rank, prompt_id_offset=rank, prompt_id_stride=W`, so prompt
ids stay distinct across ranks. Centring rewards over the GLOBAL batch (A_i = R_i - mean over all B)
is
the learner's job (an all-gather of rewards before the per-rank split). Checkpoints hold every
rank's pool cursor; resume with the same number of ranks.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from frlab.data.batch import RolloutBatch, collate, per_rank_batch
from frlab.errors import ConfigError
from frlab.stop import raise_if_stop_requested

log = logging.getLogger(__name__)

UNBOUNDED_BATCHES = 2**62

POLL_S = 0.5  # how often a waiting stream checks for a stop request
REPORT_S = 60.0  # a wait for one batch longer than this is logged (then every REPORT_S)

# Our loader is sized on purpose (see above) and single-process, so its length is exact.
warnings.filterwarnings("ignore", message="Your `IterableDataset` has `__len__` defined")
# The pool cursor is restored from the checkpoint (RolloutDataModule.state_dict): resumable.
warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before")


class PoolBatches(IterableDataset):
    """An iterable of `RolloutBatch`es drawn from a running pool (length = planned steps)."""

    def __init__(
        self, pool: Any, pad_token_id: int, length: int, timeout_s: float | None = None
    ) -> None:
        super().__init__()
        self.pool, self.pad_token_id, self.length, self.timeout_s = (
            pool,
            int(pad_token_id),
            int(length),
            timeout_s,
        )

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[RolloutBatch]:
        close = getattr(self.pool, "close_admission", None)
        for index in range(self.length):
            batch = self._next_batch()
            if index == self.length - 1 and callable(close):
                close()  # the last planned batch: free the engine (e.g. for a final evaluation)
            yield collate(batch, self.pad_token_id)

    def _next_batch(self) -> list[Any]:
        """`pool.next_batch` in POLL_S slices: a stop request raises RunInterrupted between
        slices; a long wait is logged; `timeout_s` (None: none) bounds the whole wait."""
        start = time.monotonic()
        next_report = start + REPORT_S
        while True:
            raise_if_stop_requested()
            now = time.monotonic()
            left = None if self.timeout_s is None else start + self.timeout_s - now
            if now >= next_report:
                if self._outage_s() is None:  # an outage: the pool tells it (in fewer words)
                    log.warning("waiting %.0f s for a batch: %s", now - start, self.pool.stats())
                next_report += REPORT_S
            try:
                return self.pool.next_batch(POLL_S if left is None else max(0.0, min(POLL_S, left)))
            except TimeoutError:
                if left is not None and left <= POLL_S:
                    raise

    def _outage_s(self) -> float | None:
        """The pool's engine outage under way (`RolloutPool.outage_s`; None: none, or a pool
        that does not tell)."""
        outage_s = getattr(self.pool, "outage_s", None)
        return outage_s() if callable(outage_s) else None


def _as_is(batch: RolloutBatch) -> RolloutBatch:
    return batch


class RolloutDataModule(L.LightningDataModule):
    """Starts the rollout pool in `setup`; yields `RolloutBatch`es; stops it on teardown."""

    def __init__(
        self,
        pool_factory: Callable[..., Any],
        *,
        batch_size: int,
        seed: int = 0,
        pad_token_id: int | None = None,
        batch_timeout_s: float | None = None,
        num_batches: int | None = None,
    ) -> None:
        super().__init__()
        if int(batch_size) < 1:
            raise ConfigError("data.batch_size", f"must be >= 1, got {batch_size}")
        self.pool_factory = pool_factory
        self.batch_size, self.seed = int(batch_size), int(seed)
        self.pad_token_id, self.batch_timeout_s = pad_token_id, batch_timeout_s
        self.num_batches = num_batches
        self.pool: Any = None
        self._restored: dict[str, Any] | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if self.pool is not None:
            return
        rank, world = self._rank_and_world()
        self.pool = self.pool_factory(
            batch_size=per_rank_batch(self.batch_size, world),
            seed=self.seed + rank,
            prompt_id_offset=rank,
            prompt_id_stride=world,
        )
        try:
            if self._restored is not None:
                self.pool.load_state_dict(self._restored)
            self.pool.start()
        except BaseException:
            self._stop_pool()
            raise

    def teardown(self, stage: str | None = None) -> None:
        self._stop_pool()

    def on_exception(self, exception: BaseException) -> None:
        log.info("stopping the rollout pool after %r", exception)
        self._stop_pool()

    def _stop_pool(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.stop()

    def _rank_and_world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 0, 1
        return int(trainer.global_rank), int(trainer.world_size)

    # -- data --------------------------------------------------------------------------------
    def train_dataloader(self) -> DataLoader:
        if self.pool is None:
            raise RuntimeError("RolloutDataModule.train_dataloader() before setup()")
        dataset = PoolBatches(self.pool, self._pad_id(), self._length(), self.batch_timeout_s)
        return DataLoader(dataset, batch_size=None, num_workers=0, collate_fn=_as_is)

    def _pad_id(self) -> int:
        if self.pad_token_id is not None:
            return int(self.pad_token_id)
        tok = getattr(self.pool, "tokenizer", None)
        for name in ("pad_token_id", "eos_token_id"):
            value = getattr(tok, name, None)
            if value is not None:
                return int(value)
        return 0

    def _length(self) -> int:
        if self.num_batches is not None:
            return int(self.num_batches)
        trainer = self.trainer
        steps = int(getattr(trainer, "max_steps", -1) or -1) if trainer is not None else -1
        if steps > 0:
            return steps * int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
        return UNBOUNDED_BATCHES

    # -- checkpointing -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The pool's data cursor; with W ranks, every rank's (Lightning calls this on all
        ranks when it saves, and writes rank 0's copy), so each rank resumes its own shard."""
        if self.pool is None:
            return {}
        state = self.pool.state_dict()
        rank, world = self._rank_and_world()
        if world == 1:
            return {"pool": state}
        states: list[Any] = [None] * world
        torch.distributed.all_gather_object(states, state)
        return {"pools": states}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        rank, world = self._rank_and_world()
        if "pools" in state_dict:
            if len(state_dict["pools"]) != world:
                raise ValueError(
                    f"checkpoint holds rollout-pool state for {len(state_dict['pools'])} ranks, "
                    f"this run has {world}: resume with the same number of devices"
                )
            pool_state = state_dict["pools"][rank]
        else:
            pool_state = state_dict.get("pool")
            if pool_state is not None and world > 1:
                raise ValueError(
                    "checkpoint holds one rollout-pool state; this run has W > 1 ranks"
                )
        if pool_state is None:
            return
        if self.pool is not None:
            self.pool.load_state_dict(pool_state)
        else:
            self._restored = dict(pool_state)
