"""The vLLM engine against a fake vLLM whose workers carry frlab's worker extension
(helpers.async_llm, answering as vLLM 0.28/0.29 does): loop bridging, draining pause, by-name
weight updates and their failures, one GPU per rank, and generate before start.
"""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest
import torch
from helpers.async_llm import FakeAsyncLLM, msgspec_transport

from frlab.defaults import make_vllm_engine, sampling_params
from frlab.rollout.engine import EngineError
from frlab.rollout.vllm import engine as vllm_engine
from frlab.rollout.vllm.engine import VLLMEngine
from frlab.rollout.vllm.worker_extension import SNAPSHOT_METHOD, weights_fingerprint


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
    engine = make_vllm_engine("some/model", seed=3)
    assert isinstance(engine, VLLMEngine)
    engine.start()
    try:
        fake = FakeAsyncLLM.instances[0]
        assert fake.args.logprobs_mode == "processed_logprobs" and fake.args.seed == 3
        assert fake.args.generation_config == "vllm"
        res = asyncio.run(engine.generate([1, 10], sampling_params(max_new_tokens=3)))
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
        res = asyncio.run(engine.generate([5], sampling_params(max_new_tokens=2)))
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
            asyncio.run(engine.generate(prompt, sampling_params(max_new_tokens=n)))
        )
    )
    thread.start()
    return thread, out


def _wait_in_flight(engine: VLLMEngine, n: int) -> None:
    while engine.in_flight < n:
        threading.Event().wait(0.001)


def test_update_waits_for_in_flight_requests_so_versions_are_exact(fake_vllm) -> None:
    engine = make_vllm_engine("m")
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
    engine = make_vllm_engine("m")
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
    engine = make_vllm_engine("m")
    engine.start()
    try:
        FakeAsyncLLM.instances[0].corrupt = True  # the workers ack another fingerprint
        with pytest.raises(EngineError, match="different weights"):
            engine.update_weights({"a": torch.ones(2), "b": torch.ones(3)}, version=1)
        assert engine.version == 0
        with pytest.raises(EngineError, match="refuses further requests"):
            asyncio.run(engine.generate([1], sampling_params(max_new_tokens=1)))
    finally:
        engine.shutdown()


def test_an_update_awaiting_a_dead_engine_core_fails_instead_of_hanging(fake_vllm) -> None:
    """A core killed mid-update leaves vLLM's pending rpc unanswered; the engine notices
    `AsyncLLM.errored` and the update fails naming it (the run then stops, exit 75)."""
    engine = make_vllm_engine("m")
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
    engine = make_vllm_engine("m")
    engine.start()
    try:
        fake = FakeAsyncLLM.instances[0]
        engine.update_weights({"w": torch.arange(4.0), "b": torch.tensor([-1.0])}, version=2)
        ((method, args),) = fake.rpc_calls
        assert method == SNAPSHOT_METHOD and msgspec_transport(args) == list(args)
        assert all(not isinstance(a, torch.Tensor) for a in args)
        for worker in fake.workers:
            assert torch.equal(worker.get_model().params["w"], torch.arange(4.0))
        res = asyncio.run(engine.generate([1], sampling_params(max_new_tokens=1)))
        assert res.versions == [2]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("answer", [None, False])
def test_a_prefix_cache_reset_without_success_fails_the_update(fake_vllm, answer) -> None:
    """`AsyncLLM.reset_prefix_cache` returns a bool (vllm/v1/engine/async_llm.py); anything
    but True leaves KV of the old weights in the cache."""
    engine = make_vllm_engine("m")
    engine.start()
    try:
        FakeAsyncLLM.instances[0].reset_answer = answer
        with pytest.raises(EngineError, match="prefix-cache reset"):
            engine.update_weights({"w": torch.ones(1)}, version=1)
    finally:
        engine.shutdown()


def test_an_engine_that_reports_raw_log_probs_is_refused(fake_vllm, monkeypatch) -> None:
    monkeypatch.setattr(FakeAsyncLLM, "served_mode", "raw_logprobs")
    engine = make_vllm_engine("m")
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
    engine = make_vllm_engine("m")
    engine.start()
    try:
        assert FakeAsyncLLM.instances[0].visible_at_start == expected
    finally:
        engine.shutdown()
    import os

    assert os.environ.get("CUDA_VISIBLE_DEVICES") == inherited  # restored


def test_worker_extension_streams_a_snapshot_and_acknowledges(tmp_path) -> None:
    from helpers.vllm_worker import FakeWorker

    from frlab.rollout.vllm.snapshot import write_snapshot

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
        asyncio.run(make_vllm_engine("m").generate([1], sampling_params()))
