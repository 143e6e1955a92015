"""The vLLM engine's resubmit updates against a fake vLLM that labels token versions
(helpers.async_llm.LabellingAsyncLLM): a request the update aborts goes on from prompt + its tokens
with the rest of its budget and its seed moved on, and one aborted right after its stop token
ends there, as the remote engine's requests do (frlab.rollout.weight_modes.continue_after_abort).
"""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest
import torch
from helpers.async_llm import CompletionOutput, FakeAsyncLLM, LabellingAsyncLLM

from frlab.defaults import make_vllm_engine, sampling_params
from frlab.rollout.engine import GenerationResult, SamplingParams
from frlab.rollout.vllm import engine as vllm_engine
from frlab.rollout.vllm.engine import VLLMEngine

PROMPT = [1, 4]


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch):
    """A started resubmit engine over a LabellingAsyncLLM (a GPU platform)."""
    FakeAsyncLLM.instances.clear()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    ns = SimpleNamespace(
        AsyncLLMEngine=LabellingAsyncLLM,
        AsyncEngineArgs=LabellingAsyncLLM.Args,
        SamplingParams=dict,
        TokensPrompt=dict,
        CompletionOutput=CompletionOutput,
        platform=SimpleNamespace(is_cpu=lambda: False),
    )
    monkeypatch.setattr(vllm_engine, "_import_vllm", lambda: ns)
    engine = make_vllm_engine("m", seed=3, weight_update="resubmit")
    engine.start()
    yield engine
    engine.shutdown()


def generate_across_an_update(engine: VLLMEngine, params: SamplingParams) -> GenerationResult:
    """Generate in a thread; once the fake holds the request, push version 1 (resubmit)."""
    out: list[GenerationResult] = []
    thread = threading.Thread(
        target=lambda: out.append(asyncio.run(engine.generate(PROMPT, params)))
    )
    thread.start()
    fake = FakeAsyncLLM.instances[0]
    while not fake.held:
        threading.Event().wait(0.001)
    engine.update_weights({"w": torch.ones(2)}, version=1)
    thread.join(timeout=30)
    assert not thread.is_alive() and engine.version == 1
    return out[0]


def test_an_aborted_request_goes_on_from_its_tokens_on_the_new_weights(engine) -> None:
    fake = FakeAsyncLLM.instances[0]
    assert engine.weight_update == "resubmit" and fake.label == "0"
    fake.script, fake.hold_at = [5, 6], 2
    res = generate_across_an_update(engine, sampling_params(max_new_tokens=4, seed=10))
    assert (res.token_ids, res.versions, res.finish_reason) == (
        [5, 6, 7, 8],
        [0, 0, 1, 1],
        "length",
    )
    assert res.log_probs == pytest.approx([-0.1, -0.2, -0.1, -0.2])
    assert fake.received == [(PROMPT, 4, 10), ([*PROMPT, 5, 6], 2, 12)]  # the rest, seed moved on
    assert fake.pauses == ["abort", "resume"]


def test_a_request_aborted_right_after_its_stop_token_ends_there(engine) -> None:
    """Not sent again: its continuation would sample past the stop token."""
    fake = FakeAsyncLLM.instances[0]
    fake.script, fake.hold_at = [5, 2], 2
    params = sampling_params(max_new_tokens=6, stop_token_ids=(2,), seed=10)
    res = generate_across_an_update(engine, params)
    assert (res.token_ids, res.versions, res.finish_reason) == ([5, 2], [0, 0], "stop")
    assert fake.received == [(PROMPT, 6, 10)]
