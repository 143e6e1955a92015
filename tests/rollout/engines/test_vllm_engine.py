"""The vLLM adapter on CPU: parameter mapping, log-prob extraction from vLLM's output shapes,
the engine's loop bridging, draining pause and by-name weight updates against a fake vLLM
whose workers carry frlab's worker extension. The fake answers as vLLM 0.28/0.29 does (rules
read from its sources, checked against its own code by tests/vllm_contract): rpc arguments
go through a stand-in for its msgspec transport (`msgspec_transport`: a tensor arrives as a
`[dtype, shape, buffer]` list), `reset_prefix_cache` returns a bool, the engine reports its
`vllm_config.model_config.logprobs_mode`. Real runs need a GPU (scripts/gpu_check.sh)."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
import torch
from vllm_testlib import FakeAsyncLLM, msgspec_transport

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
    SNAPSHOT_METHOD,
    check_acks,
    weights_fingerprint,
)


def test_sampling_kwargs_follow_the_frlab_contract() -> None:
    kw = vllm_sampling_kwargs(SamplingParams(0.7, 1.0, 0, 12, (2, 9)), seed=5)
    assert kw["temperature"] == 0.7 and kw["top_p"] == 1.0 and kw["top_k"] == 0
    # nothing left for a generation config to fill, penalties neutral
    assert (kw["repetition_penalty"], kw["presence_penalty"], kw["frequency_penalty"]) == (
        1.0,
        0.0,
        0.0,
    )
    assert kw["min_p"] == 0.0
    assert kw["max_tokens"] == 12 and kw["stop_token_ids"] == [2, 9] and kw["seed"] == 5
    assert kw["logprobs"] == 1 and kw["ignore_eos"] is True and kw["detokenize"] is False
    assert vllm_sampling_kwargs(SamplingParams(top_k=4))["top_k"] == 4
    assert "seed" not in vllm_sampling_kwargs(SamplingParams())
    with pytest.raises(ValueError, match="temperature"):
        vllm_sampling_kwargs(SamplingParams(temperature=0.0))


def test_engine_kwargs_fix_processed_log_probs_the_extension_and_neutral_defaults() -> None:
    fields = ["model", "seed", "logprobs_mode", "worker_extension_cls", "generation_config"]
    kw = vllm_engine_kwargs("m", fields, seed=1)
    assert kw == {
        "model": "m",
        "seed": 1,
        "logprobs_mode": "processed_logprobs",
        "worker_extension_cls": "frlab.rollout.remote.worker_extension.WeightUpdateExtension",
        "generation_config": "vllm",
    }
    with pytest.raises(ValueError, match="gpu_mem"):
        vllm_engine_kwargs("m", fields, gpu_mem=0.5)
    for missing in ("worker_extension_cls", "logprobs_mode", "generation_config"):
        with pytest.raises(ValueError, match=f"no AsyncEngineArgs.{missing}"):
            vllm_engine_kwargs("m", [f for f in fields if f != missing])  # refuse, not skip
    with pytest.raises(ValueError, match="by name"):
        vllm_engine_kwargs("m", fields, worker_extension_cls="other.Ext")


@pytest.mark.parametrize(
    ("key", "value"), [("logprobs_mode", "raw_logprobs"), ("generation_config", "auto")]
)
def test_engine_args_cannot_override_what_the_log_probs_mean(key: str, value: str) -> None:
    """`rollout.vllm_engine_args` cannot switch off processed log-probs or bring back the
    model's generation config: refused at construction, naming the key."""
    with pytest.raises(ValueError, match=f"rollout.vllm_engine_args.{key}"):
        VLLMEngine("m", **{key: value})


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


@pytest.fixture
def fake_vllm(monkeypatch):
    FakeAsyncLLM.instances.clear()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    ns = SimpleNamespace(
        AsyncLLMEngine=FakeAsyncLLM,
        AsyncEngineArgs=FakeAsyncLLM.Args,
        SamplingParams=dict,
        TokensPrompt=dict,
        platform=SimpleNamespace(is_cpu=lambda: False),  # a GPU platform
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
        assert fake.args.generation_config == "vllm"
        res = asyncio.run(engine.generate([1, 10], SamplingParams(max_new_tokens=3)))
        assert (
            res.token_ids == [11, 12, 13]
            and res.versions == [0, 0, 0]
            and res.finish_reason == "length"
        )
        assert res.log_probs == pytest.approx([-0.1, -0.2, -0.3])
        engine.update_weights({"w": torch.ones(2), "b": torch.tensor([0.5])}, version=4)
        assert [(m, a[1]) for m, a in fake.rpc_calls] == [(SNAPSHOT_METHOD, 4)]
        assert engine.version == 4
        for worker in fake.workers:
            params = worker.get_model().params
            assert torch.equal(params["w"], torch.ones(2))
            assert torch.equal(params["b"], torch.tensor([0.5]))
            assert worker.frlab_weight_version() == {"version": 4}
            assert worker.reloads == [True]  # Worker.reload_weights(is_checkpoint_format=True)
        assert fake.events[-2:] == [("rpc", SNAPSHOT_METHOD), ("reset", None)]
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
        FakeAsyncLLM.instances[0].corrupt = True  # the workers ack another fingerprint
        with pytest.raises(EngineError, match="different weights"):
            engine.update_weights({"a": torch.ones(2), "b": torch.ones(3)}, version=1)
        assert engine.version == 0
        with pytest.raises(EngineError, match="refuses further requests"):
            asyncio.run(engine.generate([1], SamplingParams(max_new_tokens=1)))
    finally:
        engine.shutdown()


def test_an_update_awaiting_a_dead_engine_core_fails_instead_of_hanging(fake_vllm) -> None:
    """A core killed mid-update leaves vLLM's pending rpc unanswered; the engine notices
    `AsyncLLM.errored` and the update fails naming it (the run then stops, exit 75)."""
    engine = VLLMEngine("m")
    engine.start()
    try:
        fake = FakeAsyncLLM.instances[0]
        fake.hang_rpc = True
        threading.Timer(0.3, setattr, (fake, "dead_error", RuntimeError("core killed"))).start()
        errors: list[BaseException] = []

        def update() -> None:
            try:
                engine.update_weights({"w": torch.ones(1)}, version=1)
            except BaseException as exc:
                errors.append(exc)

        updater = threading.Thread(target=update, daemon=True)
        updater.start()
        updater.join(timeout=10)
        assert not updater.is_alive(), "update_weights still waits on a dead engine core"
        (error,) = errors
        assert isinstance(error, EngineError) and "engine core is dead" in str(error), error
        assert "core killed" in str(error) and engine.version == 0
    finally:
        fake.hang_rpc = False
        engine.shutdown()


def test_weights_survive_vllms_rpc_transport(fake_vllm) -> None:
    """`collective_rpc` arguments reach vLLM's engine-core process through
    its msgspec encoder (vllm/v1/serial_utils.py MsgpackEncoder; decoded untyped by
    EngineCoreProc's generic decoder): a tensor in the arguments arrives as a `[dtype, shape,
    buffer index]` list without its buffer. The engine sends a snapshot path instead."""
    engine = VLLMEngine("m")
    engine.start()
    try:
        fake = FakeAsyncLLM.instances[0]
        engine.update_weights({"w": torch.arange(4.0), "b": torch.tensor([-1.0])}, version=2)
        ((method, args),) = fake.rpc_calls
        assert method == SNAPSHOT_METHOD and msgspec_transport(args) == list(args)
        assert all(not isinstance(a, torch.Tensor) for a in args)
        for worker in fake.workers:
            assert torch.equal(worker.get_model().params["w"], torch.arange(4.0))
        res = asyncio.run(engine.generate([1], SamplingParams(max_new_tokens=1)))
        assert res.versions == [2]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("answer", [None, False])
def test_a_prefix_cache_reset_without_success_fails_the_update(fake_vllm, answer) -> None:
    """`AsyncLLM.reset_prefix_cache` returns a bool (vllm/v1/engine/async_llm.py); anything
    but True leaves KV of the old weights in the cache."""
    engine = VLLMEngine("m")
    engine.start()
    try:
        FakeAsyncLLM.instances[0].reset_answer = answer
        with pytest.raises(EngineError, match="prefix-cache reset"):
            engine.update_weights({"w": torch.ones(1)}, version=1)
    finally:
        engine.shutdown()


def test_an_engine_that_reports_raw_log_probs_is_refused(fake_vllm, monkeypatch) -> None:
    monkeypatch.setattr(FakeAsyncLLM, "served_mode", "raw_logprobs")
    engine = VLLMEngine("m")
    with pytest.raises(EngineError, match="logprobs_mode='raw_logprobs'"):
        engine.start()
    assert FakeAsyncLLM.instances[0].shut  # nothing left running


@pytest.mark.parametrize(
    ("local_rank", "inherited", "expected"), [("0", None, "0"), ("1", None, "1"), ("1", "4,6", "6")]
)
def test_each_rank_starts_its_engine_on_its_own_gpu(
    fake_vllm, monkeypatch, local_rank, inherited, expected
) -> None:
    """vLLM's single-GPU engine core uses cuda:0 of what it sees
    (vllm/v1/worker/gpu_worker.py Worker.init_device), so every rank's engine landed on GPU 0.
    The engine-core process is started with only this rank's GPU visible."""
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    if inherited is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", inherited)
    engine = VLLMEngine("m")
    engine.start()
    try:
        assert FakeAsyncLLM.instances[0].visible_at_start == expected
    finally:
        engine.shutdown()
    import os

    assert os.environ.get("CUDA_VISIBLE_DEVICES") == inherited  # restored


def test_rank_visible_devices() -> None:
    from frlab.rollout.engines.vllm_args import engine_visible_devices, rank_visible_devices

    assert rank_visible_devices(0, None) == "0" and rank_visible_devices(2, "") == "2"
    assert rank_visible_devices(1, "3, 5") == "5"
    with pytest.raises(EngineError, match="CUDA_VISIBLE_DEVICES"):
        rank_visible_devices(2, "3,5")
    assert engine_visible_devices(0, {"tensor_parallel_size": 2}) is None  # spans GPUs 0..1
    with pytest.raises(EngineError, match="tensor/pipeline"):
        engine_visible_devices(1, {"tensor_parallel_size": 2})


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


def test_worker_extension_streams_a_snapshot_and_acknowledges(tmp_path) -> None:
    from vllm_worker_testlib import FakeWorker

    from frlab.rollout.remote.snapshot import write_snapshot

    worker = FakeWorker()
    weights = {"w": torch.arange(4.0), "b": torch.tensor([-1.0])}
    path, sent = write_snapshot(weights, tmp_path, 7)
    ack = worker.frlab_load_snapshot(*msgspec_transport((str(path), 7, sent)))
    assert ack == {"version": 7, "tensors": 2, "numel": 5, "sum": 5.0}
    assert ack == {"version": 7, **weights_fingerprint(list(weights.items()))}
    assert list(worker.get_model().params) == ["b", "w"]  # streamed in name order
    assert worker.frlab_weight_version() == {"version": 7}


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
