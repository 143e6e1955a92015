"""Sharing one server fleet between learner ranks: the collective weight sync
(frlab.rollout.callbacks.push_collectively), the deduplication of identical pushes
(frlab.rollout.vllm.worker_extension.same_weights), a prober that admits nothing while its engine is
paused, and a server that accepts a burst of
new connections (listen backlog), the last two against an in-process `frlab.serve` server.

Two threads play two learner ranks through `WeightSyncCallback` (a thread-backed strategy
provides `barrier` and `reduce_boolean_decision`). Rank 1 is slow: its hold returns only once
rank 0 stops its requests, and its stop only once rank 0 has started pushing (or after a short
wait). A correct protocol never lets rank 0 stop before rank 1 holds, nor push before rank 1
has stopped (drained, paused or frozen), so there rank 1 waits out; without the barriers
rank 0 would push into rank 1's in-flight work and the order checks fail.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from helpers.fleet import remote_engine
from helpers.models import policy_of

from frlab.defaults import torch_engine
from frlab.rollout.callbacks import WeightSyncCallback, shares_fleet
from frlab.rollout.vllm.snapshot import write_snapshot
from frlab.rollout.vllm.worker_extension import WeightUpdateExtension, same_weights

WORLD = 2


class ThreadRanks:
    """What the ranks share: a barrier, the votes of a boolean all-reduce and an event log."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(WORLD, timeout=30)
        self.votes: dict[int, bool] = {}
        self.events: list[tuple[str, int]] = []
        self.lock = threading.Lock()
        self.pushing = threading.Event()
        self.stopping = threading.Event()

    def log(self, what: str, rank: int) -> None:
        with self.lock:
            self.events.append((what, rank))


class ThreadStrategy:
    """Lightning's strategy collectives, for ranks that are threads."""

    def __init__(self, ranks: ThreadRanks, rank: int) -> None:
        self.ranks, self.rank = ranks, rank

    def barrier(self, name: str | None = None) -> None:
        self.ranks.barrier.wait()

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:  # noqa: A002
        self.ranks.votes[self.rank] = bool(decision)
        self.ranks.barrier.wait()
        result = sum(self.ranks.votes.values()) == WORLD if all else any(self.ranks.votes.values())
        self.ranks.barrier.wait()  # everyone has read the votes before the next round
        return result


class FleetEngine:
    """A rank's engine on the shared fleet: logs the phases of an update; rank 1 holds and
    stops slowly."""

    shared_across_ranks = True

    def __init__(self, ranks: ThreadRanks, rank: int) -> None:
        self.ranks, self.rank, self.version = ranks, rank, 0

    def hold_for_update(self) -> None:
        if self.rank == 1:  # late: returns once rank 0 stops (a broken protocol)
            self.ranks.stopping.wait(timeout=0.5)
        self.ranks.log("held", self.rank)

    def stop_for_update(self) -> None:
        self.ranks.stopping.set()
        if self.rank == 1:  # still draining: returns once rank 0 pushes (a broken protocol)
            self.ranks.pushing.wait(timeout=0.5)
        self.ranks.log("paused", self.rank)

    def release_update(self) -> None:
        self.ranks.log("resumed", self.rank)


class FleetPool:
    def __init__(self, engine: FleetEngine, fail: bool = False) -> None:
        self.engine, self.fail = engine, fail
        self.pushed: list[tuple[int, float]] = []

    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        ranks, rank = self.engine.ranks, self.engine.rank
        ranks.log("push", rank)
        ranks.pushing.set()
        if self.fail:
            raise RuntimeError(f"rank {rank}: server refused the snapshot")
        self.pushed.append((version, float(state_dict["weight"].sum())))
        self.engine.version = version

    def set_learner_version(self, version: int) -> None:
        pass


def run_ranks(fail_rank: int | None = None) -> tuple[ThreadRanks, list[Any], list[Any]]:
    """Both ranks call the callback's train-start push; returns the log, pools, errors."""
    ranks = ThreadRanks()
    pools = [FleetPool(FleetEngine(ranks, r), fail=r == fail_rank) for r in range(WORLD)]
    errors: list[Any] = [None] * WORLD

    def rank_main(rank: int) -> None:
        trainer = SimpleNamespace(
            world_size=WORLD,
            strategy=ThreadStrategy(ranks, rank),
            datamodule=SimpleNamespace(pool=pools[rank]),
        )
        module = SimpleNamespace(policy=torch.nn.Linear(2, 1, bias=False), policy_version=3)
        torch.nn.init.constant_(module.policy.weight, 0.5)
        try:
            WeightSyncCallback(sync_every=1).on_train_start(trainer, module)
        except Exception as exc:
            errors[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return ranks, pools, errors


def first(events: list[tuple[str, int]], what: str) -> int:
    return min(i for i, (name, _) in enumerate(events) if name == what)


def last(events: list[tuple[str, int]], what: str) -> int:
    return max(i for i, (name, _) in enumerate(events) if name == what)


def test_every_rank_drains_before_any_push_and_pushes_before_any_resume() -> None:
    ranks, pools, errors = run_ranks()
    assert errors == [None, None]
    events = ranks.events
    phases = ("held", "paused", "push", "resumed")
    assert sorted(events) == sorted((e, r) for e in phases for r in (0, 1))
    assert last(events, "held") < first(events, "paused")  # a resubmit abort: every rank's own
    assert last(events, "paused") < first(events, "push")
    assert last(events, "push") < first(events, "resumed")
    assert [p.pushed for p in pools] == [[(3, 1.0)], [(3, 1.0)]]  # same weights, same version


@pytest.mark.parametrize("fail_rank", [0, 1])
def test_a_failed_push_on_one_rank_raises_on_every_rank(fail_rank: int) -> None:
    ranks, pools, errors = run_ranks(fail_rank)
    other = 1 - fail_rank
    assert "server refused the snapshot" in str(errors[fail_rank])
    assert isinstance(errors[other], RuntimeError)
    assert "failed on another learner rank" in str(errors[other])
    assert ranks.events.count(("resumed", fail_rank)) == 1  # never left paused
    assert ("resumed", other) in ranks.events and pools[other].pushed == [(3, 1.0)]


@pytest.mark.parametrize(
    ("shared", "world", "expected"),
    [(True, 2, True), (True, 1, False), (False, 2, False)],
)
def test_only_a_fleet_engine_with_several_ranks_syncs_collectively(
    shared: bool, world: int, expected: bool
) -> None:
    engine = SimpleNamespace(shared_across_ranks=shared)
    trainer = SimpleNamespace(world_size=world)
    assert shares_fleet(trainer, SimpleNamespace(engine=engine)) is expected


def test_a_private_engine_with_several_ranks_pushes_without_collectives() -> None:
    calls: list[int] = []
    pool = SimpleNamespace(
        engine=SimpleNamespace(version=0),  # torch / in-process vLLM: one engine per rank
        update_weights=lambda sd, version: calls.append(version),
    )
    never: Callable[..., Any] = lambda *a, **k: pytest.fail("collective on a private engine")  # noqa: E731
    trainer = SimpleNamespace(
        world_size=2,
        strategy=SimpleNamespace(barrier=never, reduce_boolean_decision=never),
        datamodule=SimpleNamespace(pool=pool),
    )
    module = SimpleNamespace(policy=torch.nn.Linear(2, 1), policy_version=0)
    WeightSyncCallback(sync_every=1).on_train_start(trainer, module)
    assert calls == [0]


def test_the_vllm_worker_deduplicates_a_push_of_the_weights_it_holds(tmp_path: Path) -> None:
    loads: list[int] = []
    worker = WeightUpdateExtension()
    worker.reload_weights = lambda weights_iterator, is_checkpoint_format: loads.append(
        len(list(weights_iterator))
    )
    state = {"w": torch.full((3,), 2.0), "v": torch.ones(1)}
    path0, fp = write_snapshot(state, tmp_path / "rank0", 5)
    path1, same = write_snapshot(state, tmp_path / "rank1", 5)
    first_ack = worker.frlab_load_snapshot(str(path0), 5, fp)
    assert worker.frlab_load_snapshot(str(path1), 5, same) == first_ack and loads == [2]
    worker.frlab_load_snapshot(str(path1), 5)  # no fingerprint sent: always loads
    other, fp_other = write_snapshot({**state, "v": torch.zeros(1)}, tmp_path / "rank1", 6)
    worker.frlab_load_snapshot(str(other), 6, fp_other)  # a new version: loads
    worker.frlab_load_snapshot(str(path0), 5, fp)  # back to v5 (a resumed run): loads
    assert loads == [2, 2, 2, 2] and worker.frlab_weight_version() == {"version": 5}


def test_same_weights_needs_the_version_and_the_fingerprint() -> None:
    ack = {"version": 2, "tensors": 3, "numel": 10, "sum": 1.5}
    assert same_weights(ack, 2, {"tensors": 3, "numel": 10, "sum": 1.5})
    assert not same_weights(ack, 3, {"tensors": 3, "numel": 10, "sum": 1.5})
    assert not same_weights(ack, 2, {"tensors": 3, "numel": 10, "sum": 1.6})
    assert not same_weights(ack, 2, None) and not same_weights(None, 2, ack)
    assert not same_weights(ack, 2, {"sum": 1.5})  # malformed: never a match


@pytest.fixture
def in_process_server() -> Any:
    """One frlab.serve HTTP server on a thread of this process (no subprocess start-up)."""
    from helpers.serve import TINY_QWEN2, free_port, url

    from frlab.serve.server import ServeState, serve

    policy = policy_of(config=dict(TINY_QWEN2), seed=0)
    state = ServeState(torch_engine(policy, device="cpu", seed=0), "tiny")
    port, ready = free_port(), threading.Event()
    thread = threading.Thread(target=serve, args=(state, "127.0.0.1", port, ready), daemon=True)
    thread.start()
    assert ready.wait(timeout=30)
    try:
        yield url(port), policy
    finally:
        state.server.shutdown()
        thread.join(timeout=30)


@pytest.mark.slow
def test_the_prober_admits_no_server_while_the_engine_is_paused(in_process_server: Any) -> None:
    """During a collective sync a rank's prober must not load its older snapshot over the
    version another rank has just pushed: while paused (or held by a collective update) it
    re-admits nothing."""

    server_url, policy = in_process_server
    engine = remote_engine([server_url], probe_interval_s=0.02, initial_weights=policy.state_dict())
    engine.start()
    try:
        server = engine.servers[0]
        for readmitted, (hold, release) in enumerate(
            [(engine.pause, engine.resume), (engine.hold_for_update, engine.release_update)], 1
        ):
            hold()
            server.state = "stale"  # as if its last answer had been refused
            time.sleep(0.3)  # ~15 probe intervals
            assert server.state == "stale" and engine.stats()["readmissions"] == readmitted - 1
            release()
            deadline = time.monotonic() + 30
            while server.state != "ok" and time.monotonic() < deadline:
                time.sleep(0.02)
            assert server.state == "ok" and engine.stats()["readmissions"] == readmitted
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_the_server_accepts_a_burst_of_new_connections(in_process_server: Any) -> None:
    """A pool opens max_in_flight connections at once: none may be dropped (listen backlog)."""
    import asyncio

    import httpx

    server_url, _ = in_process_server
    body = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2, "logprobs": 0}

    async def burst() -> list[Any]:
        limits = httpx.Limits(max_connections=None)
        async with httpx.AsyncClient(timeout=60, limits=limits, trust_env=False) as client:

            async def one() -> Any:
                try:
                    return (
                        await client.post(f"{server_url}/v1/completions", json=body)
                    ).status_code
                except httpx.HTTPError as exc:
                    return repr(exc)

            return await asyncio.gather(*(one() for _ in range(64)))

    answers = [code for _ in range(3) for code in asyncio.run(burst())]
    assert answers == [200] * len(answers)
