"""`python -m frlab.serve` honours the completions body's `seed` (vLLM's per-request seed): the
same seed gives the same tokens whatever else is in flight, another seed other tokens."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest
from helpers.models import policy_of
from helpers.ports import free_port
from helpers.tiny import tiny_qwen2_config

from frlab.defaults import torch_engine
from frlab.rollout.remote.protocol import request_seed, sampling_from_request
from frlab.serve.server import ServeState, serve

CONFIG = tiny_qwen2_config()


@pytest.fixture
def server_url() -> Any:
    port = free_port()
    state = ServeState(torch_engine(policy_of(config=CONFIG, seed=0), seed=0), "tiny")
    ready = threading.Event()
    thread = threading.Thread(target=serve, args=(state, "127.0.0.1", port, ready), daemon=True)
    thread.start()
    assert ready.wait(timeout=30)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        state.server.shutdown()
        thread.join(timeout=30)


def complete(base: str, seed: int | None) -> list[int]:
    body: dict[str, Any] = {"model": "tiny", "prompt": [3, 5, 7], "max_tokens": 12, "logprobs": 1}
    if seed is not None:
        body["seed"] = seed
    answer = httpx.post(base + "/v1/completions", json=body, timeout=60, trust_env=False)
    answer.raise_for_status()
    return answer.json()["choices"][0]["token_ids"]


def test_the_same_seed_gives_the_same_tokens(server_url: str) -> None:
    first, unseeded, second, other = (complete(server_url, s) for s in (11, None, 11, 12))
    assert first == second and len(first) == 12
    assert other != first


def test_seed_field_parsing() -> None:
    _, params = sampling_from_request({"prompt": [1], "seed": 5})
    assert params.seed == 5
    assert sampling_from_request({"prompt": [1]})[1].seed is None
    assert request_seed(-1) == 2**63 - 1
    for bad in (2**63, "3", 1.5, True):
        with pytest.raises(ValueError, match="seed"):
            request_seed(bad)
