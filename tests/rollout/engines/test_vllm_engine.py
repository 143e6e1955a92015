"""The vLLM adapter on CPU: parameter mapping, log-prob extraction from vLLM's output shapes,
the engine's loop bridging, draining pause and by-name weight updates against a fake vLLM
whose workers carry frlab's worker extension. Real runs need a GPU (none has happened)."""

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

from frlab.rollout.engine import EngineError, SamplingParams
from frlab.rollout.engines import vllm as vllm_engine
from frlab.rollout.engines.vllm import (
    VLLMEngine,
    generation_result,
    sampled_log_probs,
    vllm_engine_kwargs,
    vllm_sampling_kwargs,
)
from frlab.rollout.remote.worker_extension import (
    LOAD_WEIGHTS_METHOD,
    WORKER_EXTENSION_CLS,
    WeightUpdateExtension,
    check_acks,
    weights_fingerprint,
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


def test_engine_kwargs_ask_for_processed_log_probs_and_the_worker_extension() -> None:
    fields = ["model", "seed", "logprobs_mode", "worker_extension_cls"]
    kw = vllm_engine_kwargs("m", fields, seed=1)
    assert kw == {
        "model": "m",
        "seed": 1,
        "logprobs_mode": "processed_logprobs",
        "worker_extension_cls": "frlab.rollout.remote.worker_extension.WeightUpdateExtension",
    }
    assert "logprobs_mode" not in vllm_engine_kwargs("m", ["model", "worker_extension_cls"])
    with pytest.raises(ValueError, match="gpu_mem"):
        vllm_engine_kwargs("m", fields, gpu_mem=0.5)
    with pytest.raises(ValueError, match="worker_extension_cls"):
        vllm_engine_kwargs("m", ["model", "logprobs_mode"])  # a vLLM without the field
    with pytest.raises(ValueError, match="by name"):
        vllm_engine_kwargs("m", fields, worker_extension_cls="other.Ext")


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


# -- a fake vLLM: enough of AsyncLLM to drive the adapter's threads and weight path ------------
@dataclasses.dataclass
class FakeArgs:
    model: str
    seed: int = 0
    logprobs_mode: str = "raw_logprobs"
    worker_extension_cls: str = ""


class FakeModel:
    def __init__(self) -> None:
        self.loaded: list[dict[str, torch.Tensor]] = []

    def load_weights(self, weights):
        self.loaded.append(dict(weights))
        return {name for name, _ in weights}


class FakeWorker(WeightUpdateExtension):
    """What vLLM builds from `worker_extension_cls`: its worker class with the extension."""

    def __init__(self) -> None:
        self.model_runner = SimpleNamespace(model=FakeModel())


def msgpack_like(value):
    """vLLM's transport to its worker processes: tuples arrive as lists, tensors as copies."""
    if isinstance(value, tuple | list):
        return [msgpack_like(v) for v in value]
    return value.clone() if isinstance(value, torch.Tensor) else value


class FakeAsyncLLM:
    instances: list[FakeAsyncLLM] = []

    def __init__(self, args: FakeArgs) -> None:
        self.args, self.shut, self.rpc_calls, self.events = args, False, [], []
        self.workers = [FakeWorker(), FakeWorker()]  # two tensor-parallel ranks
        self.release: threading.Event | None = None  # when set, requests wait for it
        self.corrupt = False
        FakeAsyncLLM.instances.append(self)

    @classmethod
    def from_engine_args(cls, args: FakeArgs) -> FakeAsyncLLM:
        assert args.worker_extension_cls == WORKER_EXTENSION_CLS
        return cls(args)

    async def generate(self, prompt, sampling, request_id):
        tokens = []
        self.events.append(("start", request_id))
        for step in range(sampling["max_tokens"]):
            tokens.append(prompt["prompt_token_ids"][-1] + step + 1)
            await asyncio.sleep(0)
            while step == 0 and self.release is not None and not self.release.is_set():
                await asyncio.sleep(0.001)
            done = step == sampling["max_tokens"] - 1
            yield SimpleNamespace(outputs=[completion(list(tokens), "length" if done else None)])
        self.events.append(("finish", request_id))

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        if not isinstance(method, str):  # V1 refuses callables without insecure serialisation
            raise TypeError("collective_rpc callables need VLLM_ALLOW_INSECURE_SERIALIZATION=1")
        self.rpc_calls.append((method, args))
        self.events.append(("rpc", method))
        sent = msgpack_like(args)
        if self.corrupt:
            sent[0] = sent[0][:-1]
        return [getattr(w, method)(*sent, **(kwargs or {})) for w in self.workers]

    async def reset_prefix_cache(self):
        self.events.append(("reset", None))
        return True

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


def test_engine_bridges_loops_and_updates_weights_by_method_name(fake_vllm) -> None:
    engine = VLLMEngine("some/model", seed=3)
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
        engine.update_weights({"w": torch.ones(2), "b": torch.tensor([0.5])}, version=4)
        assert [(m, a[1]) for m, a in fake.rpc_calls] == [(LOAD_WEIGHTS_METHOD, 4)]
        assert engine.version == 4
        for worker in fake.workers:
            (loaded,) = worker.model_runner.model.loaded
            assert torch.equal(loaded["w"], torch.ones(2)) and torch.equal(
                loaded["b"], torch.tensor([0.5])
            )
            assert worker.frlab_weight_version() == 4
        assert fake.events[-2:] == [("rpc", LOAD_WEIGHTS_METHOD), ("reset", None)]
        res = asyncio.run(engine.generate([5], SamplingParams(max_new_tokens=2)))
        assert res.versions == [4, 4]
    finally:
        engine.shutdown()
    assert fake.shut
    assert not any(t.name == "frlab-vllm-engine" for t in threading.enumerate())


def _generate_in_thread(
    engine: VLLMEngine, prompt: list[int], n: int
) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(
        target=lambda: out.append(
            asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=n)))
        )
    )
    thread.start()
    return thread, out


def _wait_in_flight(engine: VLLMEngine, n: int) -> None:
    while engine.in_flight < n:
        threading.Event().wait(0.001)


def test_update_waits_for_in_flight_requests_so_versions_are_exact(fake_vllm) -> None:
    engine = VLLMEngine("m")
    engine.start()
    try:
        fake = FakeAsyncLLM.instances[0]
        fake.release = threading.Event()
        gen, out = _generate_in_thread(engine, [1], 3)
        _wait_in_flight(engine, 1)
        updater = threading.Thread(target=engine.update_weights, args=({"w": torch.zeros(1)}, 1))
        updater.start()
        updater.join(timeout=0.2)
        assert updater.is_alive() and not fake.rpc_calls  # held until the request finishes
        fake.release.set()
        gen.join()
        updater.join()
        (res,) = out
        assert res.versions == [0, 0, 0] and engine.version == 1
        kinds = [kind for kind, _ in fake.events]
        assert kinds == ["start", "finish", "rpc", "reset"]
    finally:
        engine.shutdown()


def test_pause_waits_for_in_flight_requests_and_holds_new_ones(fake_vllm) -> None:
    engine = VLLMEngine("m")
    engine.start()
    try:
        fake = FakeAsyncLLM.instances[0]
        fake.release = threading.Event()
        first, first_out = _generate_in_thread(engine, [1], 2)
        _wait_in_flight(engine, 1)
        pauser = threading.Thread(target=engine.pause)
        pauser.start()
        pauser.join(timeout=0.2)
        assert pauser.is_alive()  # pause() has not returned while a request runs
        fake.release.set()
        pauser.join()
        assert engine.in_flight == 0 and [k for k, _ in fake.events] == ["start", "finish"]
        first.join()
        assert first_out[0].versions == [0, 0]
        second, second_out = _generate_in_thread(engine, [5], 1)
        second.join(timeout=0.2)
        assert second.is_alive() and len(fake.events) == 2  # held while paused
        engine.resume()
        second.join()
        assert second_out[0].token_ids == [6]
    finally:
        engine.shutdown()


def test_a_bad_worker_ack_fails_the_update_and_the_engine(fake_vllm) -> None:
    engine = VLLMEngine("m")
    engine.start()
    try:
        FakeAsyncLLM.instances[0].corrupt = True  # the workers receive one tensor fewer
        with pytest.raises(EngineError, match="different weights"):
            engine.update_weights({"a": torch.ones(2), "b": torch.ones(3)}, version=1)
        assert engine.version == 0
        with pytest.raises(EngineError, match="refuses further requests"):
            asyncio.run(engine.generate([1], SamplingParams(max_new_tokens=1)))
    finally:
        engine.shutdown()


def test_check_acks_names_what_went_wrong() -> None:
    sent = weights_fingerprint([("w", torch.ones(3))])
    check_acks([{"version": 2, **sent}, {"version": 2, **sent}], 2, sent)
    with pytest.raises(RuntimeError, match="no worker acknowledgement"):
        check_acks([], 2, sent)
    with pytest.raises(RuntimeError, match="worker 1 reports weight version 1"):
        check_acks([{"version": 2, **sent}, {"version": 1, **sent}], 2, sent)
    with pytest.raises(RuntimeError, match="worker 0 received different"):
        check_acks([{"version": 2, **sent, "sum": 4.0}], 2, sent)
    with pytest.raises(RuntimeError, match="not a weight ack"):
        check_acks([None], 2, sent)


def test_worker_extension_loads_by_name_and_acknowledges() -> None:
    worker = FakeWorker()
    weights = [("w", torch.arange(4.0)), ("b", torch.tensor([-1.0]))]
    ack = worker.frlab_load_weights(msgpack_like(weights), 7)
    assert ack == {"version": 7, "tensors": 2, "numel": 5, "sum": 5.0}
    assert ack == {"version": 7, **weights_fingerprint(weights)}
    assert list(worker.model_runner.model.loaded[0]) == ["w", "b"]
    assert worker.frlab_weight_version() == 7
    assert worker.frlab_load_weights({"w": torch.ones(1)}, 8)["version"] == 8
    with pytest.raises(TypeError, match="'w' is list"):
        worker.frlab_load_weights([("w", [1.0])], 9)
    with pytest.raises(TypeError, match="entry 0"):
        worker.frlab_load_weights([(3, torch.ones(1))], 9)
    with pytest.raises(ValueError, match="empty"):
        worker.frlab_load_weights([], 9)
    assert worker.frlab_weight_version() == 8


def test_generate_before_start_is_a_clear_error() -> None:
    with pytest.raises(EngineError, match="start"):
        asyncio.run(VLLMEngine("m").generate([1], SamplingParams()))


def test_importing_the_adapter_and_worker_does_not_import_vllm() -> None:
    code = (
        "import sys, frlab.rollout, frlab.rollout.engines.vllm, frlab.rollout.remote.worker_extension; "
        "print('vllm' in sys.modules)"
    )
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
