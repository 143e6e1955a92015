"""frlab's remote backend against vLLM's OWN OpenAI-compatible server application on a CPU:
`build_app` + `init_app_state` as `vllm serve` runs them, with the exact flags of frlab's
launch recipes parsed by vLLM's parser, over an engine client that implements vLLM's
`EngineClient` (tests/helpers/vllm_app.py). Every HTTP route, request model,
sampling-parameter merge (generation config), response model, dev-mode router and health
answer on the way is vLLM's code; only token sampling and the GPU workers are stand-ins."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.fleet import remote_engine
from helpers.vllm_contract import tiny_model

from frlab.defaults import sampling_params

pytestmark = pytest.mark.vllm_contract
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def vllm_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from helpers.vllm_app import VllmAppServer

    server = VllmAppServer(str(tiny_model(tmp_path_factory.mktemp("app") / "tiny")))
    server.start()
    yield server
    server.close()


def test_the_remote_engine_runs_against_vllms_app(vllm_app: Any, tmp_path: Path) -> None:
    """Admission (/v1/models, /server_info, /collective_rpc frlab_load_snapshot and
    frlab_weight_version, /reset_prefix_cache), generation and a weight sync, all answered
    by vLLM's application; the sampling parameters vLLM derives from frlab's request carry
    no penalty and processed log-probs are what comes back."""
    weights = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2)}
    engine = remote_engine(
        [vllm_app.url],
        snapshot_dir=str(tmp_path),
        request_timeout_s=60.0,
        probe_interval_s=0.2,
        startup_timeout_s=60.0,
        initial_weights=weights,
    )
    engine.start()
    try:
        assert engine.stats()["servers_healthy"] == 1
        params = sampling_params(temperature=0.7, max_new_tokens=3)
        res = asyncio.run(engine.generate([1, 2, 3], params))
        assert res.token_ids == [4, 5, 6] and res.log_probs == pytest.approx([-0.5, -0.51, -0.52])
        assert res.versions == [0, 0, 0] and res.finish_reason == "length"
        sp = vllm_app.client.sampling[-1]
        assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p) == (0.7, 1.0, 0, 0.0)
        assert (sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty) == (1.0, 0.0, 0.0)
        assert sp.logprobs == 1 and sp.ignore_eos and sp.max_tokens == 3
        engine.update_weights({k: v + 1 for k, v in weights.items()}, 1)
        assert engine.version == 1 and engine.stats()["servers_healthy"] == 1
        for worker in vllm_app.client.workers:
            assert torch.equal(worker.get_model().params["b"], torch.full((2,), 2.0))
        assert asyncio.run(engine.generate([9], params)).versions == [1, 1, 1]
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_a_short_rollout_remote_run_against_vllms_app(vllm_app: Any, tmp_path: Path) -> None:
    """`python -m frlab rollout=remote` (the toy preset: a vocabulary of 64, like the served
    tiny model) trains 2 steps with vLLM's application as its only server."""
    run_dir = tmp_path / "run"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": "offline",
    }
    cmd = [
        sys.executable,
        "-m",
        "frlab",
        "rollout=remote",
        f"rollout.remote.servers=[{vllm_app.url}]",
        "rollout.remote.request_timeout_s=60",
        "trainer.max_steps=2",
        "data.batch_size=8",
        "data.micro_batch_size=8",
        "rollout.max_in_flight=8",
        f"hydra.run.dir={run_dir}",
    ]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 2
    assert vllm_app.client.rpcs.count("frlab_load_snapshot") >= 3  # initial + 2 syncs
