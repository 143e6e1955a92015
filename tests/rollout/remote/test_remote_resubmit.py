"""`rollout.weight_update=resubmit` on a fleet of vLLM-like servers (`PausingVllmServer`): a
weight update stops the requests in flight with vLLM's `/pause?mode=abort`, loads, resumes,
and each stopped request goes on from prompt + its tokens with the rest of its budget."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.fleet import remote_engine
from helpers.pausing_vllm import VOCAB, PausingVllmServer

from frlab.defaults import sampling_params
from frlab.rollout.engine import GenerationResult, SamplingParams
from frlab.rollout.remote import protocol as proto
from frlab.rollout.remote.engine import RemoteEngine
from frlab.rollout.weight_modes import Fragment

WEIGHTS = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2)}
PROMPT = [1, 2, 3]


@pytest.fixture
def server() -> Iterator[PausingVllmServer]:
    fake = PausingVllmServer(step_s=0.02)
    yield fake
    fake.close()


def engine_on(servers: list[PausingVllmServer], tmp_path: Path, **kw: Any) -> RemoteEngine:
    engine = remote_engine(
        [s.url for s in servers],
        snapshot_dir=str(tmp_path),
        request_timeout_s=10.0,
        max_retries=2,
        probe_interval_s=0.05,
        startup_timeout_s=5.0,
        initial_weights=WEIGHTS,
        weight_update="resubmit",
        **kw,
    )
    engine.start()
    return engine


def wait_until(cond: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


class Background:
    """`n` concurrent `engine.generate` calls on a thread of their own."""

    def __init__(self, engine: RemoteEngine, n: int, max_new_tokens: int) -> None:
        params = sampling_params(max_new_tokens=max_new_tokens)
        self.results: list[GenerationResult] = []

        async def go() -> None:
            gens = (engine.generate([*PROMPT, i], params) for i in range(n))
            self.results = list(await asyncio.gather(*gens))

        self.thread = threading.Thread(target=lambda: asyncio.run(go()), daemon=True)
        self.thread.start()

    def join(self, timeout: float = 30.0) -> list[GenerationResult]:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "generation did not finish"
        return self.results


def update(engine: RemoteEngine, version: int) -> None:
    engine.update_weights({k: v + version for k, v in WEIGHTS.items()}, version)


def counting_from(last: int, n: int) -> list[int]:
    """What the fake samples after token `last`: consecutive ids."""
    return [(last + 1 + i) % VOCAB for i in range(n)]


def test_resubmit_is_offered_by_the_remote_engine() -> None:
    assert "resubmit" in RemoteEngine.weight_updates()


def test_a_request_spanning_an_update_goes_on_from_its_tokens_on_the_new_weights(
    server: PausingVllmServer, tmp_path: Path
) -> None:
    """Its first tokens carry the old version, the rest the new (each the version the
    server's workers held when it sampled it); the continuation is prompt + tokens with the
    rest of the budget, sent once; the request ends at exactly max_new_tokens."""
    engine = engine_on([server], tmp_path)
    try:
        job = Background(engine, 1, max_new_tokens=30)
        wait_until(lambda: server.in_progress() >= 5)
        update(engine, 1)
        (res,) = job.join()
        assert engine.version == 1 and engine.stats()["servers_healthy"] == 1
    finally:
        engine.shutdown()
    k = res.versions.count(0)
    assert 5 <= k < 30
    assert res.versions == [0] * k + [1] * (30 - k)
    assert res.token_ids == counting_from(0, 30) and res.finish_reason == "length"
    assert res.log_probs == [-0.5] * 30
    assert [v for held in server.finished for v in held.versions] == res.versions  # the truth
    first = [*PROMPT, 0]
    assert server.received == [(first, 30), (first + res.token_ids[:k], 30 - k)]
    assert server.pauses == [proto.PAUSE_ABORT, proto.RESUME]


def test_no_request_is_lost_or_sent_twice_across_two_updates(
    server: PausingVllmServer, tmp_path: Path
) -> None:
    """Six requests, two updates while they run: every request ends with its whole budget,
    its versions are the workers' own and never go back, and the server received each
    request once plus one continuation per abort that left budget."""
    engine = engine_on([server], tmp_path)
    try:
        job = Background(engine, 6, max_new_tokens=40)
        wait_until(lambda: server.in_progress() >= 12)
        update(engine, 1)
        wait_until(lambda: server.in_progress() >= 12)
        update(engine, 2)
        results = job.join()
        assert engine.stats()["retries"] == 0 and engine.stats()["server_faults"] == 0
    finally:
        engine.shutdown()
    for i, res in enumerate(results):
        assert len(res.token_ids) == 40 and res.finish_reason == "length"
        assert res.token_ids == counting_from(i, 40)
        assert res.versions == sorted(res.versions) and res.versions[-1] == 2
    truth = {}
    for held in server.finished:
        truth.setdefault(held.prompt[len(PROMPT)], []).extend(held.versions)
    assert [truth[i] for i in range(6)] == [r.versions for r in results]
    aborted = [h for h in server.finished if h.aborted and len(h.tokens) < h.max_tokens]
    assert len(server.received) == 6 + len(aborted) and len(aborted) >= 6
    originals = [p for p, _ in server.received if len(p) == len(PROMPT) + 1]
    assert sorted(originals) == sorted([*PROMPT, i] for i in range(6))


def test_an_abort_nobody_asked_for_fails_over_and_the_request_is_whole(
    tmp_path: Path,
) -> None:
    """An abort outside a resubmit update is a server fault: the fragment is sent again
    (here on the other server) from where it started, nothing is counted twice."""
    servers = [PausingVllmServer(step_s=0.02), PausingVllmServer(step_s=0.02)]
    engine = engine_on(servers, tmp_path)
    try:
        job = Background(engine, 1, max_new_tokens=20)
        wait_until(lambda: servers[0].in_progress() >= 3)
        servers[0].post(proto.ABORT_REQUESTS, {})
        (res,) = job.join()
        assert engine.stats()["server_faults"] == 1 and engine.stats()["retries"] == 1
    finally:
        engine.shutdown()
        for s in servers:
            s.close()
    assert res.token_ids == counting_from(0, 20) and res.versions == [0] * 20
    assert [r[1] for r in servers[1].received] == [20]


def test_a_server_that_dies_during_a_resubmit_update_is_skipped(tmp_path: Path) -> None:
    """As under drain: the dead server is marked dead and not loaded, the update completes on
    the other, and the request it held fails over and ends whole on the new weights."""
    servers = [PausingVllmServer(step_s=0.02), PausingVllmServer(step_s=0.02)]
    engine = engine_on(servers, tmp_path)
    try:
        job = Background(engine, 1, max_new_tokens=20)
        wait_until(lambda: servers[0].in_progress() >= 3)
        servers[0].down = True  # answers 503 to everything from now on: the pause too
        update(engine, 1)
        assert engine.version == 1
        assert [s.state for s in engine.servers] == ["dead", "ok"]
        (res,) = job.join()  # the request it held answers HTTP 500 when done: fails over
    finally:
        engine.shutdown()
        for s in servers:
            s.close()
    assert len(res.token_ids) == 20 and res.versions == [1] * 20


def test_a_request_that_reaches_the_server_after_the_pause_is_aborted_and_sent_again(
    tmp_path: Path,
) -> None:
    """Sent before the update closed the gate, it reaches vLLM after the pause and waits
    there, queued: the update aborts it with `/abort_requests` (no token sampled), and it
    is sent once more, whole, on the new weights."""
    server = PausingVllmServer(step_s=0.02, arrival_s=0.3)
    engine = engine_on([server], tmp_path)
    try:
        job = Background(engine, 1, max_new_tokens=10)
        wait_until(lambda: engine._in_flight > 0)
        update(engine, 1)
        (res,) = job.join()
    finally:
        engine.shutdown()
        server.close()
    assert res.token_ids == counting_from(0, 10) and res.versions == [1] * 10
    assert server.received == [([*PROMPT, 0], 10)] * 2
    assert server.pauses[0] == proto.PAUSE_ABORT and server.pauses[-1] == proto.RESUME
    assert proto.ABORT_REQUESTS in server.pauses


@pytest.mark.parametrize(("tokens", "reason"), [([5, 6, 7], "length"), ([5, 2], "stop")])
def test_an_abort_that_ends_the_request_is_not_sent_again(
    tokens: list[int], reason: str, tmp_path: Path
) -> None:
    """Aborted with its budget spent it ends as `length`; after a stop token, as `stop`
    (frlab.rollout.weight_modes.continue_after_abort); the fleet counts the abort."""
    engine = remote_engine(["http://127.0.0.1:9"], snapshot_dir=str(tmp_path))
    sent: list[tuple[list[int], int]] = []

    async def dispatch(prompt: list[int], params: SamplingParams) -> Fragment:
        sent.append((prompt, params.max_new_tokens))
        return Fragment(tokens, [-0.5] * len(tokens), [0] * len(tokens), "abort")

    engine._dispatch = dispatch  # type: ignore[method-assign]
    params = sampling_params(max_new_tokens=3, stop_token_ids=(2,))
    res = asyncio.run(engine._generate(PROMPT, params))
    assert (res.token_ids, res.finish_reason, sent) == (tokens, reason, [(PROMPT, 3)])
    assert engine._fleet.counts["resubmitted"] == 1
