"""The dry run's memory plan (frlab.model.memory_plan): parameter counts on the meta device
equal a real model's (with and without LoRA), the activation and KV-cache estimates are the
documented formulas (hand-computed), FSDP2 shards the states, an in-process vLLM takes its
share, and the one-GPU LoRA preset plans to fit an 80 GB GPU where the full model does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.tiny import tiny_qwen2_config

from frlab.config.preflight import locate_engine
from frlab.model.memory_plan import (
    MemoryPlan,
    activation_bytes,
    count_parameters,
    kv_cache_bytes,
    memory_plan,
)

REPO = Path(__file__).resolve().parents[2]
TINY = tiny_qwen2_config()
LORA = {"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["all-linear"], "adapter": None}
GIB = 2**30


def tiny_config():  # noqa: ANN201
    from frlab.model.policy import make_config

    return make_config(dict(TINY))


def test_meta_device_counts_equal_a_real_models() -> None:
    from transformers import AutoModelForCausalLM

    from frlab.model.lora import apply_lora

    real = AutoModelForCausalLM.from_config(tiny_config())
    total, trainable, _ = count_parameters(tiny_config(), None)
    assert total == trainable == sum(p.numel() for p in real.parameters()) == 20768
    adapted = apply_lora(real, LORA)  # in place
    total, trainable, nbytes = count_parameters(tiny_config(), LORA)
    assert total == 20768  # the base, counted once
    assert trainable == sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    # rank 4 on q, k, v, o, gate, up, down of 2 layers: 4 x (in + out) each
    assert trainable == 2 * 4 * ((32 + 32) + (32 + 16) * 2 + (32 + 32) + (32 + 64) * 2 + (64 + 32))
    assert nbytes == 4 * trainable


def test_activation_and_kv_estimates_are_the_documented_formulas() -> None:
    config = tiny_config()
    block = 100 * (8 * 32 + 3 * 64) * 4  # tokens x (8 hidden + 3 intermediate) x bytes
    logits = 2 * 100 * 64 * 4  # min(tokens, chunk) x vocab, float32, logits and softmax
    assert activation_bytes(config, 100, False, 4, 1024) == 2 * block + logits
    assert activation_bytes(config, 100, True, 4, 1024) == 100 * 32 * 2 * 4 + block + logits
    assert activation_bytes(config, 100, True, 4, 10) == 100 * 32 * 2 * 4 + block + 2 * 10 * 64 * 4
    # K and V, 2 layers x 2 KV heads x head dim 8, bf16, 3 sequences of 10 tokens
    assert kv_cache_bytes(config, 3, 10, 2) == 2 * 2 * 2 * 8 * 2 * 3 * 10


def run_cfg(**over) -> dict:  # noqa: ANN003
    cfg = {
        "model": {
            "config": dict(TINY),
            "dtype": "float32",
            "gradient_checkpointing": False,
            "logprob_chunk_size": 1024,
            "lora": None,
        },
        "data": {"micro_batch_size": 2, "max_tokens_per_micro_batch": None},
        "rollout": {
            "engine": {"_target_": "frlab.rollout.torch.engine.TorchEngine.for_policy"},
            "max_len": 50,
            "max_in_flight": 3,
            "device": "cpu",
        },
        "trainer": {"strategy": "auto", "devices": 1, "precision": "32-true"},
    }
    for key, value in over.items():
        section, name = key.split("__")
        cfg[section][name] = value
    return cfg


def test_states_shard_under_fsdp2_and_vllm_takes_its_share() -> None:
    plain = memory_plan(run_cfg())
    assert isinstance(plain, MemoryPlan) and plain.engine is None
    assert (plain.weights, plain.grads, plain.optimizer) == (4 * 20768, 4 * 20768, 8 * 20768)
    assert plain.activations == activation_bytes(tiny_config(), 100, False, 4, 1024)
    fsdp = memory_plan(
        run_cfg(
            trainer__strategy={"_target_": "frlab.learner.sharding.FSDP2Strategy"},
            trainer__devices=4,
        )
    )
    assert (fsdp.weights, fsdp.grads, fsdp.optimizer) == (20768, 20768, 2 * 20768)
    vllm = {"_target_": "frlab.rollout.vllm.engine.VLLMEngine.for_policy"}
    colocated = memory_plan(
        run_cfg(
            rollout__engine=vllm,
            rollout__device="cuda",
            rollout__vllm_engine_args={"gpu_memory_utilization": 0.5},
        ),
        engine_reserves_share=locate_engine({"engine": vllm}).reserves_gpu_share,
    )
    assert colocated.engine == 2 * 20768 + kv_cache_bytes(tiny_config(), 3, 50, 2)
    assert colocated.gpu_needed() == int(max(colocated.learner / 0.5, colocated.engine / 0.5))
    torch_engine = {"engine": {"_target_": "frlab.rollout.torch.engine.TorchEngine.for_policy"}}
    assert not locate_engine(torch_engine).reserves_gpu_share
    lora = memory_plan(run_cfg(model__lora=LORA))
    assert lora.weights == plain.weights and lora.grads < plain.grads / 4


QWEN7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16",
}


def dry_run_memory(cache: Path, *overrides: str) -> str:
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "frlab", *overrides, "dry_run=true"]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.strip().startswith("memory")]
    return line


@pytest.mark.slow
def test_the_one_gpu_lora_preset_plans_to_fit_an_80_gb_gpu(tmp_path: Path) -> None:
    snapshot = tmp_path / "models--Qwen--Qwen2.5-7B-Instruct" / "snapshots" / "0"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(QWEN7B))
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0")
    lora = dry_run_memory(tmp_path, "experiment=python_tool_qwen7b_lora")
    full = dry_run_memory(tmp_path, "experiment=python_tool_qwen7b", "trainer=gpu")
    needed = {
        name: float(line.split("needs a device of >= ")[1].split()[0])
        for name, line in (("lora", lora), ("full", full))
    }
    assert "7.62B params (80.7M trainable)" in lora, lora
    assert needed["lora"] < 80 * 1e9 / GIB < needed["full"], (lora, full)
