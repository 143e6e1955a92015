"""The remote engine against servers that answer as vLLM really does (the breakages reading vLLM's
sources found).

`FakeVllmServer` (helpers.nccl) answers the way vLLM 0.28/0.29's dev-mode OpenAI server does,
rules read from its sources and checked against its own code in the `vllm_contract` tier:
`/collective_rpc` results that are not a dict, list or None come back as `str(result)`;
`/health` is 200 with an empty body; `/reset_prefix_cache` reports `{"success": bool}`;
`/server_info` reports the config's `logprobs_mode`. Filesystem weight sync, no NCCL.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.fleet import remote_engine
from helpers.nccl import FakeVllmServer

from frlab.config.compose import compose
from frlab.config.errors import ConfigError
from frlab.config.preflight import preflight
from frlab.defaults import sampling_params
from frlab.rollout.engine import EngineError
from frlab.rollout.remote.engine import RemoteEngine

WEIGHTS = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2)}


@pytest.fixture
def server() -> Iterator[FakeVllmServer]:
    fake = FakeVllmServer(n_workers=2)
    yield fake
    fake.close()


def engine_on(server: FakeVllmServer, tmp_path: Path, **kw: Any) -> RemoteEngine:
    kw = {"startup_timeout_s": 1.0, **kw}
    return remote_engine(
        [server.url],
        snapshot_dir=str(tmp_path),
        request_timeout_s=5.0,
        max_retries=1,
        probe_interval_s=0.05,
        initial_weights=WEIGHTS,
        **kw,
    )


def wait_until(cond: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_a_vllm_server_is_admitted_although_its_router_stringifies_scalars(
    server: FakeVllmServer, tmp_path: Path
) -> None:
    """Point 2: a worker answering a bare version 3 reaches the client as "3" (vLLM's
    `collective_rpc` route in vllm/entrypoints/serve/dev/rpc/api_router.py), which never
    equals 3: no vLLM server was ever admitted. The worker answers `{"version": 3}`."""
    engine = engine_on(server, tmp_path)
    engine.start()
    try:
        assert engine.stats()["servers_healthy"] == 1
        engine.update_weights({k: v + 1 for k, v in WEIGHTS.items()}, 3)
        assert engine.stats()["servers_healthy"] == 1 and engine.version == 3
        for worker in server.workers:
            assert torch.equal(worker.get_model().params["b"], torch.full((2,), 2.0))
            assert worker.reloads == [True, True]  # through Worker.reload_weights
        res = asyncio.run(engine.generate([1, 2], sampling_params(max_new_tokens=2)))
        assert res.versions == [3, 3]
    finally:
        engine.shutdown()


def test_a_server_that_went_down_is_readmitted_when_its_health_body_is_empty(
    server: FakeVllmServer, tmp_path: Path
) -> None:
    """Point 3: vLLM's `/health` (vllm/entrypoints/serve/instrumentator/health.py) answers
    200 with an EMPTY body; decoding it as JSON made every probe fail, so a server that went
    down was never re-admitted."""
    engine = engine_on(server, tmp_path)
    engine.start()
    try:
        server.down = True
        with pytest.raises(EngineError):
            asyncio.run(engine.generate([1], sampling_params(max_new_tokens=1)))
        assert engine.stats()["servers_dead"] == 1
        server.down = False
        wait_until(lambda: engine.stats()["servers_healthy"] == 1)
        assert engine.stats()["readmissions"] == 1
    finally:
        engine.shutdown()


def test_a_server_without_processed_logprobs_is_refused(
    server: FakeVllmServer, tmp_path: Path
) -> None:
    """A server whose `/server_info` does not report `logprobs_mode=processed_logprobs`
    returns log-probs of another distribution than the one sampled from: never admitted."""
    server.logprobs_mode = "raw_logprobs"
    engine = engine_on(server, tmp_path)
    with pytest.raises(EngineError, match="logprobs_mode='raw_logprobs'"):
        engine.start()


def test_a_prefix_cache_reset_that_failed_refuses_the_server(
    server: FakeVllmServer, tmp_path: Path
) -> None:
    """vLLM's `/reset_prefix_cache` reports `{"success": false}` while blocks are held
    (vllm/entrypoints/serve/dev/cache/api_router.py): a server whose cache still holds KV of
    the old weights must not serve; it is re-admitted once a reset succeeds."""
    server.reset_ok = False
    engine = engine_on(server, tmp_path)
    with pytest.raises(EngineError, match="prefix-cache reset"):
        engine.start()
    server.reset_ok = True
    engine = engine_on(server, tmp_path)
    engine.start()
    engine.shutdown()


def test_nccl_with_servers_on_other_hosts_needs_an_explicit_master_address() -> None:
    """Point 8: `gethostbyname(gethostname())` may be the loopback alias 127.0.1.1, which
    servers on other hosts cannot reach: with such servers the address must be given."""
    from frlab.rollout.remote.hosts import nccl_master_address

    assert nccl_master_address(None, ["http://127.0.0.1:8100", "http://localhost:1"]) == (
        "127.0.0.1"
    )
    assert nccl_master_address("10.0.0.7", ["http://node3:8100"]) == "10.0.0.7"
    with pytest.raises(ValueError, match="rollout.remote.nccl_master_address"):
        nccl_master_address(None, ["http://127.0.0.1:8100", "http://node3:8100"])
    with pytest.raises(ValueError, match="rollout.remote.nccl_master_address"):
        remote_engine(["http://10.0.0.5:8100"], weight_sync="nccl")
    cfg = compose(
        [
            "rollout=remote",
            "rollout.remote.servers=[http://node3:8100]",
            "rollout.remote.weight_sync=nccl",
        ]
    )
    with pytest.raises(ConfigError, match="nccl_master_address"):
        preflight(cfg)
    cfg.rollout.remote.nccl_master_address = "10.0.0.7"
    cfg.rollout.remote.allow_unauthenticated = True  # no server is reached
    preflight(cfg)
