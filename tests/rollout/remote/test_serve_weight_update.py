"""`python -m frlab.serve --weight-update MODE`: the mode reaches the server's torch engine, is
reported in `/server_info`, and a fleet run with `rollout.weight_update=resubmit` gets the
partial-rollout semantics from a server in that mode (and refuses one in another mode)."""

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
from helpers.serve import TINY_QWEN2, Fleet, free_port, save_tiny_model, url

from frlab.defaults import sampling_params
from frlab.rollout.engine import EngineError, GenerationResult
from frlab.rollout.remote import control
from frlab.rollout.remote import protocol as proto
from frlab.rollout.remote.engine import RemoteEngine
from frlab.serve import __main__ as serve_main

pytestmark = pytest.mark.slow  # a module fixture starts servers or runs a training run

PROMPT = [1, 2, 3]


def test_the_flag_is_parsed_and_checked() -> None:
    base = ["--model-config", "configs/model/toy_qwen2.yaml"]
    assert serve_main.parse_args(base).weight_update is None  # the torch engine's default
    assert serve_main.parse_args([*base, "--weight-update", "resubmit"]).weight_update == "resubmit"
    with pytest.raises(SystemExit):
        serve_main.parse_args([*base, "--weight-update", "later"])


@pytest.mark.parametrize("mode", [None, "in_flight", "resubmit", "drain"])
def test_main_passes_the_mode_to_its_torch_engine(mode: str | None, monkeypatch: Any) -> None:
    built: dict[str, Any] = {}

    class Recorder:
        def __init__(self, policy: Any, **kw: Any) -> None:
            built.update(kw)

    import frlab.rollout.torch.engine as torch_engines

    monkeypatch.setattr(torch_engines, "TorchEngine", Recorder)
    # main sets the server's thread count (--threads, default 1): recorded, not applied to
    # this test process, whose later tests compare runs at its thread count
    monkeypatch.setattr(torch, "set_num_threads", lambda n: built.update(threads=n))
    monkeypatch.setattr(serve_main, "build_server_policy", lambda args: object())
    monkeypatch.setattr(serve_main, "serve", lambda state, host, port: None)
    argv = ["--model-config", "x.yaml"] + ([] if mode is None else ["--weight-update", mode])
    assert serve_main.main(argv) == 0
    assert built["weight_update"] == mode and built["threads"] == 1


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, int, int, Any]]:
    """One server in resubmit mode, one in the default mode; the model they serve."""
    root = tmp_path_factory.mktemp("modes")
    base = save_tiny_model(root / "model", seed=0)
    fleet = Fleet(root / "model", root)
    resubmit, default = free_port(), free_port()
    try:
        # one request at a time: an update lands in the middle of some request
        fleet.start([resubmit], extra=["--weight-update", "resubmit", "--max-batch-size", "1"])
        fleet.start([default])
        yield fleet, resubmit, default, base
    finally:
        fleet.close()


def info(port: int) -> Any:
    return httpx.get(url(port) + proto.SERVER_INFO, timeout=5.0, trust_env=False).json()


def engine_on(port: int, tmp_path: Path, mode: str, weights: Any) -> RemoteEngine:
    return remote_engine(
        [url(port)],
        snapshot_dir=str(tmp_path / "snaps"),
        request_timeout_s=30.0,
        probe_interval_s=0.2,
        startup_timeout_s=30.0,  # a deadline for a loaded machine: a refusal comes at once
        weight_update=mode,
        initial_weights=weights,
    )


def test_each_server_reports_its_mode(servers: tuple[Fleet, int, int, Any]) -> None:
    _, resubmit, default, _ = servers
    assert control.served_weight_update(info(resubmit)) == "resubmit"
    assert control.served_weight_update(info(default)) == "in_flight"  # TorchEngine's default


def test_a_fleet_asking_another_mode_refuses_the_server(
    servers: tuple[Fleet, int, int, Any], tmp_path: Path
) -> None:
    _, resubmit, default, base = servers
    engine = engine_on(default, tmp_path, "resubmit", base.state_dict())
    with pytest.raises(EngineError, match="--weight-update in_flight"):
        engine.start()
    engine = engine_on(resubmit, tmp_path, "in_flight", base.state_dict())
    with pytest.raises(EngineError, match="needs frlab.serve --weight-update in_flight"):
        engine.start()


def teacher_forced(model: Any, context: list[int], tokens: list[int]) -> torch.Tensor:
    """Log-probs (temperature 1) of `tokens` after `context` under `model`, one forward."""
    ids = torch.tensor([context + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(context) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


def test_resubmit_on_frlab_serve_prefills_the_tokens_so_far_on_the_new_weights(
    servers: tuple[Fleet, int, int, Any], tmp_path: Path
) -> None:
    """Requests that span the update: tokens of v0 are the old weights' probabilities; those
    of v1 equal the new weights' forward over the WHOLE context (prompt + every earlier token:
    a fresh prefill, no KV of the old weights), and not the old weights'."""

    fleet, resubmit, _, base = servers
    new = policy_of(config=dict(TINY_QWEN2), seed=7)
    engine = engine_on(resubmit, tmp_path, "resubmit", base.state_dict())
    engine.start()
    results: list[GenerationResult] = []
    params = sampling_params(max_new_tokens=120)

    async def go() -> None:
        results.extend(await asyncio.gather(*(engine.generate(PROMPT, params) for _ in range(8))))

    job = threading.Thread(target=lambda: asyncio.run(go()), daemon=True)
    done_before = fleet.log(resubmit).count("completion:")
    try:
        job.start()
        deadline = time.monotonic() + 60
        while fleet.log(resubmit).count("completion:") < done_before + 2:
            assert time.monotonic() < deadline, "the server answered no completion"
            time.sleep(0.005)
        engine.update_weights(new.state_dict(), 1)
        job.join(60)
    finally:
        engine.shutdown()
    spanning = [r for r in results if r.versions[0] == 0 and r.versions[-1] == 1]
    assert len(results) == 8 and spanning, [sorted(set(r.versions)) for r in results]
    for res in results:
        assert len(res.token_ids) == 120 and res.versions == sorted(res.versions)
        got = torch.tensor(res.log_probs)
        k = res.versions.count(0)
        old = teacher_forced(base, PROMPT, res.token_ids)
        fresh = teacher_forced(new, PROMPT, res.token_ids)
        assert torch.allclose(got[:k], old[:k], atol=1e-4), (got[:k], old[:k])
        assert torch.allclose(got[k:], fresh[k:], atol=1e-4), (got[k:], fresh[k:])
        if 0 < k < 120:
            assert not torch.allclose(got[k:], old[k:], atol=1e-3)
