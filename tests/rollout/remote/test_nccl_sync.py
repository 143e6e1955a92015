"""`rollout.remote.weight_sync=nccl` end to end on CPU with fakes (helpers.nccl):
fake vllm trainer modules in sys.modules and in-process fake vLLM servers whose workers run
frlab's real `WeightUpdateExtension`. Checked: the group (ranks, offsets, address, port), the
call sequence of one sync, what is sent (names, dtypes, shapes, values), the version commit,
stale refusal on a wrong fingerprint or version, re-forming the group after a restart, the
snapshot fallback, a failed broadcast, the missing-API error and bad settings. Nothing here
runs NCCL or vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from helpers.fleet import remote_engine
from helpers.nccl import EVENTS, WIRE, FakeTrainerEngine, FakeVllmServer, install_fake_vllm

from frlab.defaults import sampling_params
from frlab.rollout.engine import EngineError
from frlab.rollout.remote import control
from frlab.rollout.remote import protocol as proto
from frlab.rollout.remote.engine import RemoteEngine


def weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(4, 3, generator=g),
        "norm.weight": torch.randn(3, generator=g).to(torch.bfloat16),
        "head.bias": torch.arange(5, dtype=torch.float64) + seed,
    }


@pytest.fixture(params=["0.28", "0.33"])
def servers(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[list[FakeVllmServer]]:
    """The fleet, with vLLM's trainer API in the shape of 0.28-0.32 and of 0.33."""
    install_fake_vllm(monkeypatch, api=request.param)
    fleet = [FakeVllmServer(n_workers=2), FakeVllmServer(n_workers=1)]
    yield fleet
    for server in fleet:
        server.close()


def make_engine(fleet: list[FakeVllmServer], **kw: Any) -> RemoteEngine:
    kw = {"nccl_master_address": "10.1.2.3", "nccl_master_port": 29500, **kw}
    return remote_engine(
        [s.url for s in fleet],
        weight_sync="nccl",
        request_timeout_s=5.0,
        probe_interval_s=0.05,
        startup_timeout_s=5.0,
        initial_weights=weights(0),
        **kw,
    )


@contextlib.contextmanager
def running(fleet: list[FakeVllmServer], **kw: Any) -> Iterator[RemoteEngine]:
    """A started nccl engine over `fleet`, shut down on exit."""
    engine = make_engine(fleet, **kw)
    engine.start()
    try:
        yield engine
    finally:
        engine.shutdown()


def wait_until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def generate(engine: RemoteEngine) -> Any:
    params = sampling_params(max_new_tokens=2)
    return asyncio.run(engine.generate([1, 2, 3], params))


def held(server: FakeVllmServer) -> list[dict[str, torch.Tensor]]:
    return [w.get_model().params for w in server.workers]


def events(path: str) -> list[tuple[str, Any]]:
    return [(url, body) for what, url, body in EVENTS if what == path]


def rpcs(method: str) -> list[str]:
    return [url for url, body in events(proto.COLLECTIVE_RPC) if body["method"] == method]


def test_start_forms_one_group_over_the_fleet_and_sends_the_exact_weights(
    servers: list[FakeVllmServer],
) -> None:
    a, b = servers
    with running(servers) as engine:
        ((_, _, info),) = [e for e in EVENTS if e[0] == "trainer_init"]
        assert (info.master_address, info.master_port, info.world_size) == ("10.1.2.3", 29500, 4)
        assert (info.rank, info.packed) == (0, True)
        inits = {url: body["init_info"] for url, body in events(proto.INIT_WEIGHT_TRANSFER)}
        assert inits[a.url]["rank_offset"] == 1 and inits[b.url]["rank_offset"] == 3
        assert {i["world_size"] for i in inits.values()} == {4}
        sent = WIRE[29500]
        assert [n for n, _ in sent] == ["embed.weight", "norm.weight", "head.bias"]
        assert [t.dtype for _, t in sent] == [torch.float32, torch.bfloat16, torch.float64]
        for server in servers:
            for params in held(server):
                for name, tensor in weights(0).items():
                    assert torch.equal(params[name], tensor)
            assert [w.frlab_weight_version()["version"] for w in server.workers] == [
                0
            ] * server.n_workers
        assert [s.state for s in engine.servers] == ["ok", "ok"]
        assert [s.version for s in engine.servers] == [0, 0]
    assert ("trainer_shutdown", "", 29500) in EVENTS


def test_one_sync_runs_begin_broadcast_commit_verify_in_order(
    servers: list[FakeVllmServer],
) -> None:
    with running(servers) as engine:
        EVENTS.clear()
        engine.update_weights(weights(1), 1)
        phase = {
            "frlab_nccl_begin": 0,
            proto.START_WEIGHT_UPDATE: 1,
            proto.UPDATE_WEIGHTS: 2,
            proto.FINISH_WEIGHT_UPDATE: 3,
            "frlab_commit_version": 4,
            proto.RESET_PREFIX_CACHE: 4,
            "frlab_weight_version": 5,
        }
        steps = [
            body["method"] if what == proto.COLLECTIVE_RPC else what for what, _, body in EVENTS
        ]
        assert sorted(steps, key=phase.__getitem__) == steps  # phases never interleave
        assert sorted(steps) == sorted(list(phase) * 2)  # each step once on each server
        for server in servers:  # a server's cache is reset only after it committed
            mine = [s for s, (_, url, _) in zip(steps, EVENTS, strict=True) if url == server.url]
            assert mine.index(proto.RESET_PREFIX_CACHE) > mine.index("frlab_commit_version")
        assert [body for _, body in events(proto.FINISH_WEIGHT_UPDATE)] == [
            {"weight_version": "1"}
        ] * 2
        commit = [
            b for _, b in events(proto.COLLECTIVE_RPC) if b["method"] == "frlab_commit_version"
        ][0]
        fp = commit["args"][1]
        assert commit["args"][0] == 1 and (fp["tensors"], fp["numel"]) == (3, 12 + 3 + 5)
        assert fp["sum"] == pytest.approx(sum(float(t.double().sum()) for t in weights(1).values()))
        assert not [e for e in EVENTS if e[0] == "trainer_init"]  # the group is reused
        assert [s.version for s in engine.servers] == [1, 1]
        assert torch.equal(held(servers[1])[0]["head.bias"], weights(1)["head.bias"])
        assert generate(engine).versions == [1, 1]  # the version the server proved


@pytest.mark.parametrize("fault", ["corrupt", "version_lie"])
def test_a_server_with_the_wrong_weights_or_version_is_refused_as_stale(
    servers: list[FakeVllmServer], fault: str
) -> None:
    a, b = servers
    with running(servers) as engine:
        setattr(b, fault, True if fault == "corrupt" else 7)
        engine.update_weights(weights(1), 1)
        assert [s.state for s in engine.servers] == ["ok", "stale"]
        assert engine.stats()["stale_refusals"] >= 1
        if fault == "corrupt":  # the worker did not commit what it received
            assert [w.frlab_weight_version()["version"] for w in b.workers] == [None]
        for _ in range(3):
            assert generate(engine).versions == [1, 1]
        assert len({url for url, _ in events(proto.COMPLETIONS)}) == 1  # only server a
        setattr(b, fault, False if fault == "corrupt" else None)
        engine.update_weights(weights(2), 2)
        wait_until(lambda: engine.servers[1].state == "ok")
        assert engine.servers[1].version == 2 and engine.stats()["readmissions"] >= 1


@pytest.mark.slow
def test_a_restarted_server_stays_out_until_the_next_sync_re_forms_the_group(
    servers: list[FakeVllmServer],
) -> None:
    a, b = servers
    with running(servers) as engine:
        b.restart()
        engine.servers[1].state = "dead"  # as a failed request would mark it
        wait_until(lambda: engine.servers[1].state == "stale")  # probed: it holds no version
        time.sleep(0.2)
        assert engine.servers[1].state == "stale"  # no snapshot_dir: kept out
        engine.update_weights(weights(1), 1)
        inits = [e[2] for e in EVENTS if e[0] == "trainer_init"]
        assert [i.master_port for i in inits] == [29500, 29501]  # a new group, next port
        assert [s.state for s in engine.servers] == ["ok", "ok"]
        assert [w.frlab_weight_version()["version"] for w in b.workers] == [1]
        assert torch.equal(held(b)[0]["embed.weight"], weights(1)["embed.weight"])


def test_a_server_down_at_start_joins_when_the_next_sync_re_forms_the_group(
    servers: list[FakeVllmServer],
) -> None:
    a, b = servers
    b.down = True
    with running(servers) as engine:
        assert [e[2].world_size for e in EVENTS if e[0] == "trainer_init"] == [3]  # a only
        assert [s.state for s in engine.servers] == ["ok", "dead"]
        b.down = False
        wait_until(lambda: engine.servers[1].state == "stale")  # answers, holds no version
        engine.update_weights(weights(1), 1)
        inits = [e[2] for e in EVENTS if e[0] == "trainer_init"]
        assert [(i.world_size, i.master_port) for i in inits] == [(3, 29500), (4, 29501)]
        assert [s.state for s in engine.servers] == ["ok", "ok"]
        assert [s.version for s in engine.servers] == [1, 1]


def test_with_a_snapshot_dir_a_restarted_server_loads_the_latest_snapshot(
    servers: list[FakeVllmServer], tmp_path: Any
) -> None:
    a, b = servers
    engine = make_engine(servers, snapshot_dir=str(tmp_path))
    engine.start()
    try:
        engine.update_weights(weights(1), 1)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["v0", "v1"]
        assert rpcs("frlab_load_snapshot")  # verification offers the snapshot (members dedup)
        b.restart()
        engine.servers[1].state = "dead"
        wait_until(lambda: engine.servers[1].state == "ok")
        assert [w.frlab_weight_version()["version"] for w in b.workers] == [1]
        assert torch.equal(held(b)[0]["norm.weight"], weights(1)["norm.weight"])
        assert len([e for e in EVENTS if e[0] == "trainer_init"]) == 1  # no NCCL for it yet
    finally:
        engine.shutdown()


def test_a_failed_broadcast_commits_nothing_and_the_next_sync_forms_a_new_group(
    servers: list[FakeVllmServer],
) -> None:
    with running(servers) as engine:
        FakeTrainerEngine.fail_send = True
        EVENTS.clear()
        engine.update_weights(weights(1), 1)
        assert not rpcs("frlab_commit_version")  # nothing to commit after a failed send
        assert [s.state for s in engine.servers] == ["stale", "stale"]
        assert all(w.frlab_weight_version()["version"] is None for s in servers for w in s.workers)
        FakeTrainerEngine.fail_send = False
        engine.update_weights(weights(2), 2)
        assert [e[2].master_port for e in EVENTS if e[0] == "trainer_init"] == [29501]
        wait_until(lambda: [s.state for s in engine.servers] == ["ok", "ok"])
        assert [s.version for s in engine.servers] == [2, 2]


def test_without_the_trainer_api_start_fails_naming_weight_sync(
    servers: list[FakeVllmServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    install_fake_vllm(monkeypatch, with_trainer_api=False)
    engine = make_engine(servers)
    with pytest.raises(EngineError, match="rollout.remote.weight_sync=nccl"):
        engine.start()
    engine.shutdown()
    monkeypatch.setitem(__import__("sys").modules, "vllm", None)  # vllm not installed at all
    with pytest.raises(EngineError, match="rollout.remote.weight_sync=nccl"):
        make_engine(servers).start()


def test_several_learner_ranks_are_refused_at_start(
    servers: list[FakeVllmServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    with pytest.raises(EngineError, match="one learner rank"):
        make_engine(servers).start()


@pytest.mark.parametrize(
    ("kw", "key"),
    [
        ({"nccl_master_port": 70000}, "rollout.remote.nccl_master_port"),
        ({"nccl_master_port": "29500"}, "rollout.remote.nccl_master_port"),
        ({"nccl_master_address": ""}, "rollout.remote.nccl_master_address"),
        ({"nccl_packed": "yes"}, "rollout.remote.nccl_packed"),
    ],
)
def test_bad_nccl_settings_name_their_key(kw: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        remote_engine(["http://127.0.0.1:1"], weight_sync="nccl", **kw)


def test_rank_offsets_follow_each_servers_worker_count() -> None:
    assert control.nccl_rank_offsets([2, 1, 4]) == ([1, 3, 4], 8)
    assert control.world_size_of({"world_size": 3}) == 3
    with pytest.raises(ValueError, match="worker"):
        control.nccl_rank_offsets([2, 0])
    with pytest.raises(proto.MalformedResponse):
        control.world_size_of({"world_size": 0})


def test_a_weight_source_base_that_refuses_frlabs_source_is_an_engine_error() -> None:
    """A future vLLM whose WeightSource contract changed again fails at engine start with
    frlab's EngineError naming the setting, not with vLLM's raw TypeError."""
    from frlab.rollout.vllm.nccl import TrainerApi, build_source

    class Strict:
        def __init_subclass__(cls, **kwargs: Any) -> None:
            raise TypeError(f"{cls.__name__}.metadata must be something else")

    api = TrainerApi(factory=None, init_info_cls=None, source_base=Strict, param_meta=None)
    with pytest.raises(EngineError, match="rollout.remote.weight_sync=nccl.*something else"):
        build_source(api)
