"""RemoteEngine against two real `python -m frlab.serve` processes on loopback: token-in/token-out
exactness, load spreading, weight sync, stale refusal and re-admission, garbage and hang retries.

The servers run with `--test-faults`, so one pair of processes serves every case; each test's
engine starts by loading the base weights as version 0 on both, and teardown clears faults.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from helpers.fleet import remote_engine
from helpers.models import policy_of
from helpers.serve import (
    TINY_QWEN2,
    Fleet,
    free_port,
    healthy,
    save_tiny_model,
    set_fault,
    url,
)

from frlab.defaults import sampling_params
from frlab.rollout.engine import EngineError, GenerationResult
from frlab.rollout.remote.engine import RemoteEngine

pytestmark = pytest.mark.slow  # a module fixture starts servers or runs a training run

PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, Any]]:
    root = tmp_path_factory.mktemp("fleet")
    base = save_tiny_model(root / "model", seed=0)
    servers = Fleet(root / "model", root, extra=["--test-faults"])
    try:
        servers.start([free_port(), free_port()])
        yield servers, base
    finally:
        servers.close()


@pytest.fixture
def engine(fleet: tuple[Fleet, Any], tmp_path: Path) -> Iterator[RemoteEngine]:
    servers, base = fleet
    eng = remote_engine(
        [url(p) for p in servers.procs],
        snapshot_dir=str(tmp_path / "snaps"),
        request_timeout_s=3.0,
        max_retries=4,
        probe_interval_s=0.2,
        initial_weights=base.state_dict(),
    )
    eng.start()
    try:
        yield eng
    finally:
        for port in servers.procs:
            set_fault(port, "none")
        eng.shutdown()


def generate(engine: RemoteEngine, n: int, max_new_tokens: int = 6) -> list[GenerationResult]:
    params = sampling_params(max_new_tokens=max_new_tokens)

    async def go() -> list[GenerationResult]:
        return await asyncio.gather(*(engine.generate(PROMPT, params) for _ in range(n)))

    return asyncio.run(go())


def teacher_forced(model: Any, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """Log-probs (temperature 1) of `tokens` after `prompt` under `model`, one forward."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


def assert_sampled_by(model: Any, results: list[GenerationResult], atol: float = 1e-5) -> None:
    for res in results:
        want = teacher_forced(model, PROMPT, res.token_ids)
        got = torch.tensor(res.log_probs, dtype=torch.float32)
        assert torch.allclose(got, want, rtol=0.0, atol=atol), (got, want)


def completions(servers: Fleet, port: int) -> int:
    return servers.log(port).count("completion:")


def run_collecting(engine: RemoteEngine, n: int, errors: list[BaseException]) -> None:
    """`generate(engine, n)` in a thread, recording the exception it ends with."""
    try:
        generate(engine, n)
    except BaseException as exc:  # noqa: BLE001 (recorded for the assertion)
        errors.append(exc)


def other_model(seed: int) -> Any:
    return policy_of(config=dict(TINY_QWEN2), seed=seed)


def wait_until(cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_token_round_trip_log_probs_equal_the_torch_forward(
    engine: RemoteEngine, fleet: tuple[Fleet, Any]
) -> None:
    results = generate(engine, 3)
    for res in results:
        assert len(res.token_ids) == 6 and res.versions == [0] * 6
        assert res.finish_reason == "length"
    assert_sampled_by(fleet[1], results)


def test_requests_are_spread_by_load(engine: RemoteEngine, fleet: tuple[Fleet, Any]) -> None:
    servers = fleet[0]
    for port in servers.procs:
        set_fault(port, "hang")  # hold every request where it was sent
    errors: list[BaseException] = []
    caller = threading.Thread(target=run_collecting, args=(engine, 8, errors))
    caller.start()
    wait_until(lambda: sum(s.in_flight for s in engine.servers) == 8)
    assert [s.in_flight for s in engine.servers] == [4, 4]  # least in flight first
    engine.shutdown()  # fails the held requests (the fixture clears the faults)
    caller.join(timeout=10)
    assert len(errors) == 1 and isinstance(errors[0], EngineError)


def test_weight_sync_changes_outputs_and_versions(
    engine: RemoteEngine, fleet: tuple[Fleet, Any], tmp_path: Path
) -> None:
    servers, base = fleet
    new = other_model(seed=1)
    engine.update_weights(new.state_dict(), 1)
    results = generate(engine, 4)
    assert all(r.versions == [1] * 6 for r in results) and engine.version == 1
    assert_sampled_by(new, results)
    with pytest.raises(AssertionError):
        assert_sampled_by(base, results, atol=1e-3)
    engine.update_weights(new.state_dict(), 2)
    engine.update_weights(new.state_dict(), 3)
    assert sorted(p.name for p in (tmp_path / "snaps").iterdir()) == ["v2", "v3"]
    for port in servers.procs:
        assert "frlab_weight_version -> 3" in servers.log(port)
    assert engine.stats()["servers_healthy"] == 2


def test_a_silently_stale_server_is_refused_until_it_proves_the_version(
    engine: RemoteEngine, fleet: tuple[Fleet, Any]
) -> None:
    servers, _ = fleet
    good, bad = list(servers.procs)
    set_fault(bad, "ignore-reload")
    new = other_model(seed=2)
    engine.update_weights(new.state_dict(), 1)
    stats = engine.stats()
    assert (stats["servers_healthy"], stats["servers_stale"]) == (1, 1)
    assert stats["stale_refusals"] >= 1
    before = completions(servers, bad)
    results = generate(engine, 6)
    assert all(r.versions == [1] * 6 for r in results)
    assert_sampled_by(new, results)
    assert completions(servers, bad) == before  # the stale server got nothing
    set_fault(bad, "none")
    wait_until(lambda: engine.stats()["servers_healthy"] == 2)
    assert engine.stats()["readmissions"] == 1
    log = servers.log(bad)
    assert log.rindex("frlab_load_snapshot v1 loaded") > log.rindex("v1 IGNORED")
    assert_sampled_by(new, generate(engine, 4))


def test_garbage_answers_are_retried_on_another_server(
    engine: RemoteEngine, fleet: tuple[Fleet, Any]
) -> None:
    servers, base = fleet
    set_fault(list(servers.procs)[1], "garbage")
    results = generate(engine, 6)
    assert all(r.versions == [0] * 6 for r in results)
    assert_sampled_by(base, results)
    assert engine.stats()["retries"] >= 1 and engine.stats()["server_faults"] >= 1


def test_a_hung_server_costs_a_timeout_and_a_retry(
    engine: RemoteEngine, fleet: tuple[Fleet, Any]
) -> None:
    servers, base = fleet
    set_fault(list(servers.procs)[1], "hang")
    results = generate(engine, 4)
    assert_sampled_by(base, results)
    assert engine.stats()["retries"] >= 1


def test_generate_fails_after_max_retries_when_every_server_fails(
    engine: RemoteEngine, fleet: tuple[Fleet, Any]
) -> None:
    for port in fleet[0].procs:
        set_fault(port, "garbage")
    with pytest.raises(EngineError, match=r"after 5 attempts \(rollout.remote.max_retries=4\)"):
        generate(engine, 1)
    # an attempt either reached a (re-admitted) server and failed, or found none healthy
    assert 1 <= engine.stats()["retries"] <= 5


def test_a_bad_request_fails_at_once_without_retries(engine: RemoteEngine) -> None:
    async def go() -> None:
        await engine.generate([10_000], sampling_params(max_new_tokens=2))

    with pytest.raises(EngineError, match="HTTP 400"):
        asyncio.run(go())
    assert engine.stats()["retries"] == 0


def test_start_fails_clearly_when_no_server_answers(tmp_path: Path) -> None:
    eng = remote_engine([url(free_port())], snapshot_dir=str(tmp_path), startup_timeout_s=0.3)
    with pytest.raises(EngineError, match="no server in rollout.remote.servers"):
        eng.start()
    eng.shutdown()


def test_models_and_nccl_endpoints_of_frlab_serve(fleet: tuple[Fleet, Any]) -> None:
    port = next(iter(fleet[0].procs))
    with httpx.Client(base_url=url(port), trust_env=False) as client:
        models = client.get("/v1/models").json()
        assert models["object"] == "list" and models["data"][0]["object"] == "model"
        answer = client.post("/init_weight_transfer_engine", json={"init_info": {}})
        assert answer.status_code == 501 and "vLLM" in answer.json()["error"]["message"]
        assert client.post("/collective_rpc", json={"method": "nope"}).status_code == 400


def test_shutdown_fails_pending_requests_with_engine_error(
    engine: RemoteEngine, fleet: tuple[Fleet, Any]
) -> None:
    for port in fleet[0].procs:
        set_fault(port, "hang")
    errors: list[BaseException] = []
    caller = threading.Thread(target=run_collecting, args=(engine, 2, errors))
    caller.start()
    wait_until(lambda: sum(s.in_flight for s in engine.servers) == 2)
    engine.shutdown()
    caller.join(timeout=10)
    assert not caller.is_alive() and len(errors) == 1
    assert isinstance(errors[0], EngineError) and "shut down" in str(errors[0])


def test_sigterm_stops_a_server_cleanly(fleet: tuple[Fleet, Any]) -> None:
    """Runs last in this module: it stops one of the shared servers."""
    servers = fleet[0]
    port = next(iter(servers.procs))
    proc = servers.procs.pop(port)
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    assert not healthy(port)
