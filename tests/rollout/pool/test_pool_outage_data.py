"""Data follow the seed through an outage: in sync mode, the prompts of every batch are the same
with and without an outage; in async mode, every prompt admitted is trained on, dropped for a
reason of its own, or still queued (finished, running or requeued) when the run stops."""

from __future__ import annotations

import threading

from helpers.pool_fakes import Board
from test_pool_requeue import SwitchEngine, ids, pool_of


class OutageAt(SwitchEngine):
    """Goes down at its `at`-th request (that one fails too) and comes back `for_s` later."""

    def __init__(self, at: int | None, for_s: float = 0.3) -> None:
        super().__init__()
        self.at, self.for_s, self.requests = at, for_s, 0

    async def generate(self, prompt_token_ids, params):  # noqa: ANN001, ANN201
        self.requests += 1
        if self.requests == self.at:
            self.go_down()
            threading.Timer(self.for_s, self.go_up).start()
        return await super().generate(prompt_token_ids, params)


def sync_batches(engine: OutageAt, n: int) -> tuple[list[list[int]], dict]:
    pool = pool_of(engine, Board(open_by_default=True), mode="sync", seed=5)
    pool.start()
    try:
        return [ids(pool.next_batch(timeout=30)) for _ in range(n)], pool.stats()
    finally:
        pool.stop()


def test_sync_batches_hold_the_same_prompts_with_and_without_an_outage() -> None:
    calm, _ = sync_batches(OutageAt(None), 4)
    hit, stats = sync_batches(OutageAt(7), 4)  # down in the middle of the second batch
    assert stats["requeued"] >= 1 and stats["outages"]["count"] == 1, stats
    assert hit == calm == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]


def test_async_every_admitted_prompt_is_trained_on_dropped_for_its_own_reason_or_queued() -> None:
    failing = {2, 9}  # their environment raises: a reason of their own
    board = Board(open_by_default=True, plan={n: "env_fail" for n in failing})
    engine = OutageAt(10)
    pool = pool_of(engine, board, batch_size=4, max_in_flight=8)
    pool.start()
    try:
        trained = [n for _ in range(5) for n in ids(pool.next_batch(timeout=30))]
        state, stats = pool.state_dict(), pool.stats()
    finally:
        pool.stop()
    admitted = set(range(board.count))  # a task is drawn when its prompt is admitted
    dropped = failing & admitted
    queued = [p["prompt_id"] for p in state["pending"]]
    queued += [r["trajectory"]["prompt_id"] for r in state["ready"]]
    assert stats["requeued"] >= 1 and stats["outages"]["count"] == 1, stats
    assert stats["failed_by_reason"] == {"env_step": len(dropped)} and stats["rejected"] == 0
    assert len(trained) == len(set(trained)) == 20 and len(queued) == len(set(queued))
    assert not (set(trained) & dropped) and not (set(queued) & (set(trained) | dropped))
    assert admitted == set(trained) | dropped | set(queued)
