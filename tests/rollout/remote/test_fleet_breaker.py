"""The fleet's circuit breaker (frlab.rollout.remote.breaker) against vLLM-like fake servers
(helpers.nccl): a dead server is probed on a doubling, jittered backoff, never stormed; while no
server is healthy the engine sends no request, reports an outage and fails its requests with
EngineFault (the pool requeues them); a server that returns gets the current weights before
any request; a server that stops answering `/health` is marked dead and its requests in flight
fail over at once, and a weight push under way gives up on it, without waiting out
`request_timeout_s`."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.fleet import remote_engine
from helpers.nccl import FakeVllmServer, Refused

from frlab.defaults import sampling_params
from frlab.rollout.engine import EngineFault
from frlab.rollout.remote import breaker
from frlab.rollout.remote import protocol as proto
from frlab.rollout.remote.engine import RemoteEngine

WEIGHTS = {"w": torch.arange(6.0).reshape(2, 3)}
FIRST_S, MAX_S = 0.1, 0.8


class SwitchedServer(FakeVllmServer):
    """Records each request (time, method, path); `unavailable`: 503 to every POST and no 200
    to `/health`; `hung`: `/health` and completions do not answer until the test ends;
    `stopped`: no route answers until the test ends (a SIGSTOPped process)."""

    def __init__(self) -> None:
        super().__init__(n_workers=1)
        self.unavailable = False
        self.hung = threading.Event()
        self.stopped = threading.Event()
        self.released = threading.Event()
        self.seen: list[tuple[float, str, str]] = []

    def get(self, path: str) -> Any:
        self.seen.append((time.monotonic(), "GET", path))
        if self.stopped.is_set() or (self.hung.is_set() and path == proto.HEALTH):
            self.released.wait(30)
        if self.unavailable:
            raise KeyError(path)  # 404: not the 200 a healthy server answers
        return super().get(path)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        self.seen.append((time.monotonic(), "POST", path))
        if self.unavailable:
            raise Refused(503, {"error": "unavailable"})
        if self.stopped.is_set() or (self.hung.is_set() and path == proto.COMPLETIONS):
            self.released.wait(30)
        return super().post(path, body)

    def times(self, method: str, path: str, since: float = 0.0) -> list[float]:
        return [t for t, m, p in list(self.seen) if m == method and p == path and t >= since]


@pytest.fixture
def servers() -> Iterator[list[SwitchedServer]]:
    made = [SwitchedServer(), SwitchedServer()]
    try:
        yield made
    finally:
        for server in made:
            server.released.set()
            server.close()


def engine_on(urls: list[str], tmp_path: Path, **changes: Any) -> RemoteEngine:
    settings = {
        "snapshot_dir": str(tmp_path / "snaps"),
        "request_timeout_s": 30.0,
        "max_retries": 2,
        "probe_interval_s": FIRST_S,
        "probe_backoff_max_s": MAX_S,
        "startup_timeout_s": 10.0,
        "initial_weights": WEIGHTS,
        "weight_update": "drain",
    }
    engine = remote_engine(urls, **(settings | changes))
    engine.start()
    return engine


def generate(engine: RemoteEngine) -> Any:
    async def go() -> Any:
        return await engine.generate([1, 2], sampling_params(max_new_tokens=2))

    return asyncio.run(go())


def wait_until(cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_the_backoff_doubles_up_to_its_cap_with_jitter() -> None:
    backoff = breaker.Backoff(1.0, 30.0, random.Random(0))
    assert [backoff.nominal(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    delays = [backoff.delay(3) for _ in range(200)]
    assert all(0.8 * 4 <= d <= 1.2 * 4 for d in delays) and len(set(delays)) > 100


@pytest.mark.slow
def test_a_dead_fleet_gets_no_request_and_backed_off_probes_then_the_current_weights(
    servers: list[SwitchedServer], tmp_path: Path
) -> None:
    server = servers[0]
    engine = engine_on([server.url], tmp_path)
    try:
        assert engine.outage() is None
        server.unavailable = True
        with pytest.raises(EngineFault, match="rollout.remote.max_retries=2"):
            generate(engine)  # the first attempt finds it unavailable, the others no server
        outage = engine.outage()
        assert outage is not None and f"{server.url}=dead" in outage.reason
        down_at = time.monotonic()
        with pytest.raises(EngineFault):
            generate(engine)
        assert server.times("POST", proto.COMPLETIONS, since=down_at) == []  # nothing sent
        wait_until(lambda: len(server.times("GET", proto.HEALTH, since=down_at)) >= 6)
        probes = server.times("GET", proto.HEALTH, since=down_at)
        gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
        # each wait at least the jittered nominal backoff of the failures so far: no storm
        for n, gap in enumerate(gaps[:5], start=2):
            assert gap >= 0.8 * min(MAX_S, FIRST_S * 2 ** (n - 1)) - 0.02, gaps
        back_at = time.monotonic()
        server.unavailable = False
        wait_until(lambda: engine.outage() is None)
        result = generate(engine)
        posts = [p for t, m, p in server.seen if m == "POST" and t >= back_at]
    finally:
        engine.shutdown()
    assert result.token_ids == [7, 8]
    # the returning server loaded the current snapshot and proved it before any completion
    assert posts.index(proto.COLLECTIVE_RPC) < posts.index(proto.COMPLETIONS)
    assert engine.stats()["readmissions"] == 1


def test_a_server_that_stops_answering_health_has_its_requests_failed_over_at_once(
    servers: list[SwitchedServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(breaker, "LIVENESS_S", 0.1)
    monkeypatch.setattr(breaker, "LIVENESS_TIMEOUT_S", 0.3)
    stopped, other = servers
    engine = engine_on([stopped.url, other.url], tmp_path)  # request_timeout_s: 30 s
    try:
        stopped.hung.set()  # like SIGSTOP: connections open, no answer
        result = generate(engine)  # sent to the first listed, then failed over
        victim = engine.servers[0]
    finally:
        engine.shutdown()
    assert result.token_ids == [7, 8]
    assert stopped.times("POST", proto.COMPLETIONS) and other.times("POST", proto.COMPLETIONS)
    assert victim.state == "dead" and "GET /health gave no 200" in victim.why, victim


def test_a_weight_push_gives_up_on_a_server_that_stops_answering_under_it(
    servers: list[SwitchedServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server stopped as a push begins answers neither the push nor `/health`: the push
    marks it dead at its liveness deadline (about 1 s here), not at `request_timeout_s` (30 s),
    and the other server serves the new version."""
    monkeypatch.setattr(breaker, "LIVENESS_S", 0.1)
    monkeypatch.setattr(breaker, "LIVENESS_TIMEOUT_S", 0.3)
    stopped, other = servers
    engine = engine_on([stopped.url, other.url], tmp_path)  # request_timeout_s: 30 s
    try:
        stopped.stopped.set()  # like SIGSTOP: connections open, no answer on any route
        started = time.monotonic()
        engine.update_weights({"w": WEIGHTS["w"] + 1.0}, 1)
        took = time.monotonic() - started
        victim, kept = engine.servers
        result = generate(engine)
    finally:
        engine.shutdown()
    assert stopped.times("GET", "/server_info", since=started)  # the push met it
    assert took < 10.0, took
    assert victim.state == "dead" and "GET /health gave no 200" in victim.why, victim
    assert kept.state == "ok" and kept.version == 1, kept
    assert result.token_ids == [7, 8] and engine.stats()["server_faults"] == 1
