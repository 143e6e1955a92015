"""The vLLM adapter's parts that need no engine, on CPU: sampling and engine arguments, log-prob
extraction from vLLM's output shapes, finish reasons, per-rank GPU visibility, worker acks; and
importing it does not import vLLM. The real-vLLM check needs a GPU (scripts/gpu_check.sh).
"""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from frlab.defaults import make_vllm_engine, sampling_params
from frlab.rollout.engine import EngineError, SamplingParams
from frlab.rollout.vllm.args import vllm_engine_kwargs, vllm_sampling_kwargs
from frlab.rollout.vllm.outputs import fragment, sampled_log_probs, token_versions
from frlab.rollout.vllm.worker_extension import check_acks, weights_fingerprint


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
    assert vllm_sampling_kwargs(sampling_params(top_k=4))["top_k"] == 4
    assert "seed" not in vllm_sampling_kwargs(sampling_params())
    with pytest.raises(ValueError, match="temperature"):
        vllm_sampling_kwargs(sampling_params(temperature=0.0))


def test_engine_kwargs_fix_processed_log_probs_the_extension_and_neutral_defaults() -> None:
    fields = ["model", "seed", "logprobs_mode", "worker_extension_cls", "generation_config"]
    kw = vllm_engine_kwargs("m", fields, seed=1)
    assert kw == {
        "model": "m",
        "seed": 1,
        "logprobs_mode": "processed_logprobs",
        "worker_extension_cls": "frlab.rollout.vllm.worker_extension.WeightUpdateExtension",
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
        make_vllm_engine("m", **{key: value})


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


def test_a_fragment_keeps_stop_length_and_abort() -> None:
    part = fragment(completion([4, 2], "stop"), [1, 1])
    assert (part.token_ids, part.versions, part.finish_reason) == ([4, 2], [1, 1], "stop")
    assert part.log_probs == pytest.approx([-0.1, -0.2])
    assert fragment(completion([4], "length"), [0]).finish_reason == "length"
    assert fragment(completion([4], "abort"), [0]).finish_reason == "abort"  # its tokens so far
    with pytest.raises(EngineError, match="finish_reason=None"):
        fragment(completion([4], None), [0])


def test_token_versions_read_vllms_span_objects() -> None:
    """vLLM's `WeightVersionSpan(version: str, start, end)` (vllm/outputs.py, 0.32)."""
    spans = [
        SimpleNamespace(version="3", start=0, end=2),
        SimpleNamespace(version="4", start=2, end=3),
    ]
    assert token_versions(spans, 3) == [3, 3, 4]
    assert token_versions([], 0) == [] == token_versions(None, 0)  # an abort before any token
    for bad in (
        None,
        [SimpleNamespace(version="3", start=0, end=2)],
        [{"version": "3"}],
        [SimpleNamespace(version="default", start=0, end=3)],
    ):
        with pytest.raises(EngineError, match="vLLM's token versions"):
            token_versions(bad, 3)


def test_rank_visible_devices() -> None:
    from frlab.rollout.vllm.args import engine_visible_devices, rank_visible_devices

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


@pytest.mark.slow
def test_importing_the_adapter_and_worker_does_not_import_vllm() -> None:
    code = (
        "import sys, frlab.rollout, frlab.rollout.vllm.engine, "
        "frlab.rollout.vllm.worker_extension; "
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
    engine = make_vllm_engine(
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
            engine.generate(prompt, sampling_params(temperature=0.7, max_new_tokens=8))
        )
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + res.token_ids])).logits[0].float()
        logp = torch.log_softmax(logits / 0.7, -1)[len(prompt) - 1 : -1].gather(
            1, torch.tensor(res.token_ids)[:, None]
        )
        torch.testing.assert_close(torch.tensor(res.log_probs), logp.squeeze(1), atol=2e-3, rtol=0)
        engine.update_weights(model.state_dict(), version=1)
        res = asyncio.run(engine.generate(prompt, sampling_params(max_new_tokens=2)))
        assert res.versions == [1, 1]
    finally:
        engine.shutdown()
