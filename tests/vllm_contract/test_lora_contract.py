"""What a LoRA fleet asks a `vllm serve --enable-lora` server with runtime LoRA updating,
answered by vLLM's own application (tests/helpers/vllm_app.py): the same script
of loads, listings, requests and unloads gives the same status codes and the same adapter
listing from vLLM's app as from the CPU fake `LoraVllmServer`
(tests/helpers/lora_vllm.py), and a request naming an adapter reaches vLLM's
engine with that adapter."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from helpers.vllm_contract import tiny_model

from frlab.defaults import sampling_params
from frlab.rollout.remote import protocol as proto
from frlab.rollout.remote.lora import LOAD_ADAPTER, UNLOAD_ADAPTER, listed_adapters
from frlab.rollout.vllm.lora import write_adapter

pytestmark = pytest.mark.vllm_contract
CONFIG = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}


@pytest.fixture(scope="module")
def lora_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from helpers.vllm_app import VllmAppServer

    os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # read when the routes attach
    model = tiny_model(tmp_path_factory.mktemp("lora") / "tiny")
    server = VllmAppServer(str(model), "--enable-lora", "--max-lora-rank", "8")
    server.start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def fake() -> Iterator[Any]:
    from helpers.lora_vllm import LoraVllmServer

    server = LoraVllmServer()
    yield server
    server.close()


def folders(root: Path) -> list[str]:
    """Two adapter folders as a LoRA fleet writes them (versions 0 and 1)."""
    tensors = {"base_model.model.layers.0.self_attn.q_proj.lora_A.default.weight": torch.ones(8, 4)}
    return [str(write_adapter(tensors, CONFIG, root / name, v)) for v, name in enumerate("ab")]


def play(url: str, a: str, b: str) -> list[Any]:
    """The script: what each step answered (status codes; listings as frlab reads them)."""

    def post(path: str, body: Any) -> int:
        return httpx.post(url + path, json=body, timeout=30.0, trust_env=False).status_code

    def listed() -> dict[str, str]:
        return listed_adapters(httpx.get(url + proto.MODELS, timeout=30.0, trust_env=False).json())

    def complete(model: str) -> int:
        body = proto.completion_request(model, [1, 2, 3], sampling_params(max_new_tokens=2), seed=1)
        return post(proto.COMPLETIONS, body)

    return [
        listed(),
        post(LOAD_ADAPTER, {"lora_name": "frlab-v0", "lora_path": a}),
        post(LOAD_ADAPTER, {"lora_name": "frlab-v0", "lora_path": b}),  # a name loaded: 400
        post(LOAD_ADAPTER, {"lora_name": "frlab-v1", "lora_path": b}),
        listed(),
        complete("frlab-v1"),
        complete("frlab-v9"),  # not loaded: 404
        post(UNLOAD_ADAPTER, {"lora_name": "frlab-v0"}),
        post(UNLOAD_ADAPTER, {"lora_name": "frlab-v0"}),  # gone: 404
        listed(),
    ]


def test_vllms_lora_routes_answer_as_the_fake_does(lora_app: Any, fake: Any, tmp_path: Path):
    a, b = folders(tmp_path)
    got = play(lora_app.url, a, b)
    assert got == [
        {},
        200,
        400,
        200,
        {"frlab-v0": a, "frlab-v1": b},
        200,
        404,
        200,
        404,
        {"frlab-v1": b},
    ]
    assert play(fake.url, a, b) == got
    assert ("frlab-v1", b, False) in lora_app.client.loras  # loaded, not in place
    assert lora_app.client.named_loras[-1] == "frlab-v1"  # the request reached it named
