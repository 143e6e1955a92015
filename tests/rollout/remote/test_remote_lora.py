"""LoRA on a fleet of vLLM-like servers (`LoraVllmServer`, frlab.rollout.remote.lora): each
version's adapter is loaded under its own name, proved by `/v1/models`, named by every request,
and the tokens carry the version of the adapter that sampled them (the fake's truth)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.fleet import remote_engine
from helpers.lora_vllm import LOAD, UNLOAD, LoraVllmServer
from test_remote_resubmit import Background, wait_until

from frlab.defaults import sampling_params
from frlab.rollout.engine import EngineError
from frlab.rollout.remote.engine import RemoteEngine
from frlab.rollout.remote.lora import adapter_name

CONFIG = {
    "peft_type": "LORA",
    "r": 8,
    "lora_alpha": 16,
    "target_modules": ["q_proj"],
    "frlab_adapter_name": "default",
}
NAMES = (
    "base_model.model.layers.0.q_proj.lora_A.default.weight",
    "base_model.model.layers.0.q_proj.lora_B.default.weight",
)


def adapter(version: int) -> dict[str, torch.Tensor]:
    return {n: torch.full((2, 2), float(version + i)) for i, n in enumerate(NAMES)}


@pytest.fixture
def servers() -> Iterator[list[LoraVllmServer]]:
    fakes = [LoraVllmServer(step_s=0.02), LoraVllmServer(step_s=0.02)]
    yield fakes
    for fake in fakes:
        fake.close()


def lora_engine(
    servers: list[LoraVllmServer], folder: Path, mode: str = "drain", start: bool = True, **kw: Any
) -> RemoteEngine:
    engine = remote_engine(
        [s.url for s in servers],
        snapshot_dir=str(folder),
        request_timeout_s=10.0,
        max_retries=2,
        probe_interval_s=0.05,
        startup_timeout_s=3.0,
        initial_weights=adapter(0),
        lora=CONFIG,
        weight_update=mode,
        **kw,
    )
    if start:
        engine.start()
    return engine


def generate(engine: RemoteEngine, n: int = 4) -> Any:
    import asyncio

    return asyncio.run(engine.generate([1, 2, 3], sampling_params(max_new_tokens=n)))


def test_each_version_is_loaded_under_its_own_name_and_named_by_every_request(
    servers: list[LoraVllmServer], tmp_path: Path
) -> None:
    engine = lora_engine(servers, tmp_path)
    try:
        first = [generate(engine) for _ in range(4)]
        engine.update_weights(adapter(1), 1)
        engine.update_weights(adapter(2), 2)
        after = [generate(engine) for _ in range(4)]
    finally:
        engine.shutdown()
    assert all(r.versions == [0] * 4 for r in first)
    assert all(r.versions == [2] * 4 for r in after)
    for server in servers:
        assert [n for n, _ in server.loads] == ["frlab-v0", "frlab-v1", "frlab-v2"]
        assert list(server.adapters) == ["frlab-v2"]  # older names unloaded
        assert {h.versions[0] for h in server.finished} <= {0, 2}  # the truth
        assert set(server.named) <= {"frlab-v0", "frlab-v2"}
    folders = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("adapter-v"))
    assert folders == ["adapter-v1", "adapter-v2"]  # keep_snapshots=2
    assert sorted(p.name for p in (tmp_path / "adapter-v2").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]


def test_a_resubmit_update_continues_each_request_on_the_new_adapter(
    servers: list[LoraVllmServer], tmp_path: Path
) -> None:
    """Tokens before the update were sampled by adapter v0, the rest by v1: the engine's
    versions equal the fake's truth, and no request is lost or sent twice."""
    engine = lora_engine(servers[:1], tmp_path, mode="resubmit")
    server = servers[0]
    try:
        job = Background(engine, 3, max_new_tokens=30)
        wait_until(lambda: server.in_progress() >= 9)
        engine.update_weights(adapter(1), 1)
        results = job.join()
    finally:
        engine.shutdown()
    truth = sorted(v for h in server.finished for v in h.versions)
    assert sorted(v for r in results for v in r.versions) == truth
    for res in results:
        k = res.versions.count(0)
        assert 0 < k < 30 and res.versions == [0] * k + [1] * (30 - k)
    assert len(server.received) == 6  # each request once, one continuation each


def test_a_restarted_server_is_readmitted_with_the_current_adapter(
    servers: list[LoraVllmServer], tmp_path: Path
) -> None:
    """A server that dies (a request to it fails) misses an update; restarted, it holds no
    adapter, and the prober re-admits it only once it serves the current one."""
    engine = lora_engine(servers, tmp_path)
    try:
        engine.update_weights(adapter(1), 1)
        servers[0].down = True
        generate(engine)  # goes to servers[0] first (ties: first listed), fails over
        assert engine.stats()["servers_dead"] == 1
        engine.update_weights(adapter(2), 2)
        servers[0].restart()  # a new process: no adapter loaded
        servers[0].down = False
        wait_until(lambda: engine.stats()["servers_healthy"] == 2)
        results = [generate(engine) for _ in range(6)]
    finally:
        engine.shutdown()
    assert all(r.versions == [2] * 4 for r in results)
    assert list(servers[0].adapters) == ["frlab-v2"] and servers[0].named[-1] == "frlab-v2"


def test_a_name_left_by_an_earlier_run_is_replaced_and_a_rank_copy_is_accepted(
    servers: list[LoraVllmServer], tmp_path: Path
) -> None:
    """A server that already lists `frlab-v0` with other tensors (an earlier run) has it
    reloaded; our own folder rewritten under the same version is reloaded too; a second
    learner rank pushing the same version from its own folder finds it served and loads
    nothing; a rank of the same run whose tensors differ is refused (the replicas diverged)."""
    server = servers[0]
    old = lora_engine(servers[:1], tmp_path / "old")
    old.update_weights(adapter(5), 0)  # v0 rewritten with other tensors: reloaded
    assert server.loads[-1] == ("frlab-v0", str(tmp_path / "old" / "adapter-v0"))
    assert len(server.loads) == 2
    old.shutdown()
    run = tmp_path / "run"
    rank0 = lora_engine(servers[:1], run / "rank0")
    rank1 = lora_engine(servers[:1], run / "rank1")
    try:
        assert server.adapters["frlab-v0"][0] == str(run / "rank0" / "adapter-v0")
        assert len(server.loads) == 3  # rank0 replaced the earlier run's; rank1 loaded nothing
        rank1.update_weights(adapter(0), 0)  # the same push again from rank1's folder
        assert len(server.loads) == 3 and generate(rank1).versions == [0] * 4
        bad = lora_engine(servers[:1], run / "rank2", start=False)
        bad._initial_weights, bad.startup_timeout_s = adapter(9), 0.5  # diverged replica
        try:
            with pytest.raises(EngineError, match="version 0"):
                bad.start()
            assert "replicas diverged" in bad.servers[0].why
        finally:
            bad.shutdown()
        assert len(server.loads) == 3
    finally:
        rank0.shutdown()
        rank1.shutdown()


def test_a_server_without_runtime_lora_loading_is_refused_with_the_flags_to_start_it(
    servers: list[LoraVllmServer], tmp_path: Path
) -> None:
    servers[0].lora_routes = False
    engine = lora_engine(servers, tmp_path)
    try:
        stats = engine.stats()
        assert stats["servers_healthy"] == 1 and stats["servers_stale"] == 1
        why = engine.servers[0].why
        assert "--enable-lora" in why and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" in why, why
        assert all(generate(engine).versions == [0] * 4 for _ in range(3))
    finally:
        engine.shutdown()
    assert servers[0].named == []


def test_settings_a_lora_fleet_cannot_honour_are_refused_by_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rollout.weight_update=in_flight"):
        remote_engine(
            ["http://a:1"], lora=CONFIG, weight_update="in_flight", initial_weights=adapter(0)
        )
    with pytest.raises(ValueError, match="rollout.remote.weight_sync"):
        remote_engine(["http://a:1"], lora=CONFIG, weight_sync="nccl", initial_weights=adapter(0))
    assert RemoteEngine.serves_lora and RemoteEngine.lora_weight_updates() == ("drain", "resubmit")


def test_a_full_weight_push_to_a_lora_fleet_is_refused(
    servers: list[LoraVllmServer], tmp_path: Path
) -> None:
    engine = lora_engine(servers[:1], tmp_path)
    try:
        with pytest.raises(EngineError, match="adapter tensors only"):
            engine.update_weights({"model.layers.0.q_proj.weight": torch.ones(2, 2)}, 1)
        assert engine.version == 0 and generate(engine).versions == [0] * 4
    finally:
        engine.shutdown()


def test_adapter_names_and_routes() -> None:
    assert adapter_name(7) == "frlab-v7"
    assert (LOAD, UNLOAD) == ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
