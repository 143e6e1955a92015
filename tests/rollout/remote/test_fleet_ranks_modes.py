"""`rollout.weight_update` resubmit and in_flight with several learner ranks on one fleet
(frlab.rollout.callbacks.push_collectively): two RemoteEngines (two ranks, threads with a
thread-backed strategy) with requests in flight on the same two vLLM-like servers update
collectively. No
rank drains: requests of both ranks span the update, each token carries the version that
sampled it (the fakes' truth), no request is lost, retried or taken for a server fault, and
both engines end on the new version with every server healthy."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from helpers.fleet import remote_engine
from helpers.labelling_vllm import LabellingVllmServer
from helpers.pausing_vllm import PausingVllmServer
from test_fleet_sync import ThreadRanks, ThreadStrategy
from test_remote_resubmit import WEIGHTS, Background, wait_until

from frlab.rollout.callbacks import push_collectively
from frlab.rollout.remote.engine import RemoteEngine

TOKENS = 40


class Pool:
    """What push_collectively uses of a rollout pool."""

    pins = None

    def __init__(self, engine: RemoteEngine) -> None:
        self.engine = engine

    def update_weights(self, state_dict: Any, version: int) -> None:
        self.engine.update_weights(state_dict, version)


def collective_update(engines: list[RemoteEngine], version: int) -> list[Any]:
    ranks, errors = ThreadRanks(), [None] * len(engines)
    new = {k: v + version for k, v in WEIGHTS.items()}

    def rank_main(rank: int) -> None:
        try:
            push_collectively(ThreadStrategy(ranks, rank), Pool(engines[rank]), new, version)
        except Exception as exc:  # reported below
            errors[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(len(engines))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return errors


@pytest.mark.parametrize(
    ("mode", "fake"), [("resubmit", PausingVllmServer), ("in_flight", LabellingVllmServer)]
)
def test_two_ranks_update_a_shared_fleet_without_draining(
    mode: str, fake: type, tmp_path: Path
) -> None:
    servers = [fake(step_s=0.02) for _ in range(2)]
    engines = [
        remote_engine(
            [s.url for s in servers],
            snapshot_dir=str(tmp_path / f"rank{r}"),
            request_timeout_s=10.0,
            max_retries=2,
            probe_interval_s=0.05,
            startup_timeout_s=5.0,
            initial_weights=WEIGHTS,
            weight_update=mode,
        )
        for r in range(2)
    ]
    try:
        for engine in engines:
            engine.start()
        jobs = [Background(engine, 3, max_new_tokens=TOKENS) for engine in engines]
        wait_until(lambda: all(e._in_flight == 3 for e in engines))
        wait_until(lambda: sum(s.in_progress() for s in servers) >= 24)
        assert collective_update(engines, 1) == [None, None]
        results = [res for job in jobs for res in job.join()]
        stats = [engine.stats() for engine in engines]
        assert [engine.version for engine in engines] == [1, 1]
    finally:
        for engine in engines:
            engine.shutdown()
        for server in servers:
            server.close()
    spanning = 0
    for res in results:
        assert len(res.token_ids) == TOKENS and res.finish_reason == "length"
        k = res.versions.count(0)
        assert res.versions == [0] * k + [1] * (TOKENS - k)
        spanning += 0 < k < TOKENS
    assert spanning >= 4, [r.versions.count(0) for r in results]  # a drain would give none
    held = [h for s in servers for h in (getattr(s, "generated", None) or s.finished)]
    truth = sorted(v for h in held for v in h.versions)
    assert sorted(v for r in results for v in r.versions) == truth
    for s in stats:
        assert s["retries"] == 0 and s["server_faults"] == 0 and s["servers_healthy"] == 2, s
