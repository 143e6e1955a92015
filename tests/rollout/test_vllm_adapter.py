"""The vLLM adapter on CPU: parameter mapping, log-prob extraction from vLLM's output shapes,
and the engine's loop bridging and weight updates against a fake vLLM. Real runs need a GPU."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
import torch

from frlab.rollout import vllm_engine
from frlab.rollout.engine import EngineError, SamplingParams, build_engine
from frlab.rollout.vllm_engine import (
    VLLMEngine,
    generation_result,
    sampled_log_probs,
    vllm_engine_kwargs,
    vllm_sampling_kwargs,
)


def test_sampling_kwargs_follow_the_frlab_contract() -> None:
    kw = vllm_sampling_kwargs(SamplingParams(0.7, 1.0, 0, 12, (2, 9)), seed=5)
    assert kw["temperature"] == 0.7 and kw["top_p"] == 1.0 and kw["top_k"] == -1
    assert kw["max_tokens"] == 12 and kw["stop_token_ids"] == [2, 9] and kw["seed"] == 5
    assert kw["logprobs"] == 1 and kw["ignore_eos"] is True and kw["detokenize"] is False
    assert vllm_sampling_kwargs(SamplingParams(top_k=4))["top_k"] == 4
    assert "seed" not in vllm_sampling_kwargs(SamplingParams())
    with pytest.raises(ValueError, match="temperature"):
        vllm_sampling_kwargs(SamplingParams(temperature=0.0))


def test_engine_kwargs_ask_for_processed_log_probs_when_supported() -> None:
    kw = vllm_engine_kwargs("m", ["model", "seed", "logprobs_mode"], seed=1)
    assert kw == {"model": "m", "seed": 1, "logprobs_mode": "processed_logprobs"}
    assert "logprobs_mode" not in vllm_engine_kwargs("m", ["model"])
    with pytest.raises(ValueError, match="gpu_mem"):
        vllm_engine_kwargs("m", ["model"], gpu_mem=0.5)


def Logprob(value: float) -> SimpleNamespace:  # noqa: N802 - mirrors vllm.logprobs.Logprob
    return SimpleNamespace(logprob=value, rank=1, decoded_token=None)


def test_sampled_log_probs_reads_the_sampled_token_entry() -> None:
    entries = [{5: Logprob(-0.1), 7: Logprob(-2.0)}, {3: Logprob(-0.5)}, {8: -1.5, 1: -0.2}]
    assert sampled_log_probs([7, 3, 8], entries) == [-2.0, -0.5, -1.5]
    with pytest.raises(EngineError, match="position 1"):
        sampled_log_probs([7, 4, 8], entries)
    with pytest.raises(EngineError, match="logprobs=1"):
        sampled_log_probs([7], None)
    with pytest.raises(EngineError, match="2 logprob entries"):
        sampled_log_probs([7, 3, 8], entries[:2])
    with pytest.raises(EngineError, match="not a log-prob"):
        sampled_log_probs([1], [{1: Logprob(0.3)}])


def completion(tokens, reason):
    return SimpleNamespace(
        token_ids=tokens,
        logprobs=[{t: Logprob(-0.1 * (i + 1))} for i, t in enumerate(tokens)],
        finish_reason=reason,
    )


def test_generation_result_maps_finish_reasons() -> None:
    res = generation_result(completion([4, 2], "stop"), [1, 1])
    assert (
        res.token_ids == [4, 2]
        and res.log_probs == pytest.approx([-0.1, -0.2])
        and res.finish_reason == "stop"
    )
    assert generation_result(completion([4], "length"), [0]).finish_reason == "length"
    with pytest.raises(EngineError, match="abort"):
        generation_result(completion([4], "abort"), [0])


# -- a fake vLLM: enough of AsyncLLMEngine to drive the adapter's threads and weight path ------
@dataclasses.dataclass
class FakeArgs:
    model: str
    seed: int = 0
    logprobs_mode: str = "raw_logprobs"


class FakeAsyncLLM:
    instances: list[FakeAsyncLLM] = []

    def __init__(self, args: FakeArgs) -> None:
        self.args, self.loaded, self.shut = args, [], False
        self.model_runner = SimpleNamespace(model=SimpleNamespace(load_weights=self._load))
        FakeAsyncLLM.instances.append(self)

    @classmethod
    def from_engine_args(cls, args: FakeArgs) -> FakeAsyncLLM:
        return cls(args)

    def _load(self, weights):
        self.loaded.append(dict(weights))

    async def generate(self, prompt, sampling, request_id):
        tokens = []
        for step in range(sampling["max_tokens"]):
            tokens.append(prompt["prompt_token_ids"][-1] + step + 1)
            await asyncio.sleep(0)
            done = step == sampling["max_tokens"] - 1
            yield SimpleNamespace(outputs=[completion(list(tokens), "length" if done else None)])

    async def collective_rpc(self, method, args=()):
        return [method(self, *args)]

    async def reset_prefix_cache(self):
        return None

    def shutdown(self):
        self.shut = True


@pytest.fixture
def fake_vllm(monkeypatch):
    FakeAsyncLLM.instances.clear()
    ns = SimpleNamespace(
        AsyncLLMEngine=FakeAsyncLLM,
        AsyncEngineArgs=FakeArgs,
        SamplingParams=dict,
        TokensPrompt=dict,
    )
    monkeypatch.setattr(vllm_engine, "_import_vllm", lambda: ns)
    return ns


def test_engine_bridges_loops_and_updates_weights(fake_vllm) -> None:
    engine = build_engine("vllm", model="some/model", seed=3)
    assert isinstance(engine, VLLMEngine)
    engine.start()
    try:
        fake = FakeAsyncLLM.instances[0]
        assert fake.args.logprobs_mode == "processed_logprobs" and fake.args.seed == 3
        res = asyncio.run(engine.generate([1, 10], SamplingParams(max_new_tokens=3)))
        assert (
            res.token_ids == [11, 12, 13]
            and res.versions == [0, 0, 0]
            and res.finish_reason == "length"
        )
        assert res.log_probs == pytest.approx([-0.1, -0.2, -0.3])
        engine.update_weights({"w": torch.ones(2)}, version=4)
        assert engine.version == 4 and torch.equal(fake.loaded[0]["w"], torch.ones(2))
        res = asyncio.run(engine.generate([5], SamplingParams(max_new_tokens=2)))
        assert res.versions == [4, 4]
    finally:
        engine.shutdown()
    assert fake.shut
    assert not any(t.name == "frlab-vllm-engine" for t in threading.enumerate())


def test_paused_engine_holds_new_requests(fake_vllm) -> None:
    engine = VLLMEngine("m")
    engine.start()

    async def run():
        engine.pause()
        task = asyncio.create_task(engine.generate([1], SamplingParams(max_new_tokens=1)))
        done, _ = await asyncio.wait({task}, timeout=0.2)
        engine.resume()
        return not done, await task

    try:
        held, res = asyncio.run(run())
    finally:
        engine.shutdown()
    assert held and res.token_ids == [2]


def test_generate_before_start_is_a_clear_error() -> None:
    with pytest.raises(EngineError, match="start"):
        asyncio.run(VLLMEngine("m").generate([1], SamplingParams()))


def test_importing_the_adapter_does_not_import_vllm() -> None:
    code = "import sys, frlab.rollout, frlab.rollout.vllm_engine; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def _vllm_skip_reason() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (extra `vllm`, GPU only)"
    if not torch.cuda.is_available():
        return "vLLM needs a CUDA device"
    return None


@pytest.mark.vllm
@pytest.mark.skipif(_vllm_skip_reason() is not None, reason=_vllm_skip_reason() or "")
def test_real_vllm_log_probs_match_a_forward(tmp_path) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(tmp_path)
    engine = VLLMEngine(
        str(tmp_path),
        seed=0,
        gpu_memory_utilization=0.2,
        max_model_len=256,
        enforce_eager=True,
        skip_tokenizer_init=True,
        dtype="float32",
    )
    engine.start()
    try:
        prompt = [1, 2, 3, 4]
        res = asyncio.run(
            engine.generate(prompt, SamplingParams(temperature=0.7, max_new_tokens=8))
        )
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + res.token_ids])).logits[0].float()
        logp = torch.log_softmax(logits / 0.7, -1)[len(prompt) - 1 : -1].gather(
            1, torch.tensor(res.token_ids)[:, None]
        )
        torch.testing.assert_close(torch.tensor(res.log_probs), logp.squeeze(1), atol=2e-3, rtol=0)
        engine.update_weights(model.state_dict(), version=1)
        res = asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=2)))
        assert res.versions == [1, 1]
    finally:
        engine.shutdown()
