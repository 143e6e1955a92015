"""What frlab hands vLLM's CPU build (frlab.rollout.vllm.args): the KV cache size from
config (hand-computed), CPU defaults under the user's engine arguments, the free-memory check
and the head-size check. Pure functions: the real engine runs them in tests/vllm_cpu."""

from __future__ import annotations

import pytest

from frlab.model.memory_plan import kv_bytes_per_token
from frlab.model.policy import tiny_config
from frlab.rollout.engine import EngineError
from frlab.rollout.vllm.args import (
    GIB,
    MIN_CPU_KV_CACHE,
    check_cpu_memory,
    check_head_size,
    cpu_engine_options,
    cpu_kv_cache_bytes,
)


def test_kv_bytes_per_token_counts_k_and_v_of_every_layer_and_kv_head() -> None:
    # 2 (K and V) x 2 layers x 2 KV heads x head size 16 (64 / 4 heads) x 4 bytes = 512
    assert kv_bytes_per_token(tiny_config("qwen2"), 4) == 512
    # head_dim declared on the config wins over hidden_size / heads
    assert kv_bytes_per_token(tiny_config("llama", head_dim=32), 2) == 2 * 2 * 2 * 32 * 2


def test_the_automatic_cpu_kv_cache_is_twice_what_the_sequences_need_with_a_floor() -> None:
    config = tiny_config("llama", num_hidden_layers=24, num_key_value_heads=2, head_dim=64)
    per_token = 2 * 24 * 2 * 64 * 4  # 24,576 bytes
    need = per_token * 64 * 1024  # 64 sequences of 1,024 tokens
    assert cpu_kv_cache_bytes(None, config, 64, 1024) == 2 * need
    assert cpu_kv_cache_bytes(None, config, 1, 16) == MIN_CPU_KV_CACHE  # 786 KB -> the floor
    assert cpu_kv_cache_bytes(1.5, config, 64, 1024) == int(1.5 * GIB)  # explicit GiB
    with pytest.raises(ValueError, match="rollout.engine.cpu_kv_cache_gib"):
        cpu_kv_cache_bytes(0.0, config, 1, 16)


def test_cpu_defaults_never_override_what_the_user_set() -> None:
    assert cpu_engine_options({"max_model_len": 4096}, 123) == {
        "max_model_len": 4096,
        "kv_cache_memory_bytes": 123,
        "enforce_eager": True,
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": 4096,
    }
    assert cpu_engine_options({}, 1)["max_num_batched_tokens"] == 2048  # vLLM's own default
    mine = {"gpu_memory_utilization": 0.2, "enforce_eager": False, "enable_chunked_prefill": True}
    assert cpu_engine_options(mine, 123) == mine  # vLLM's own sizing and chunking, as asked
    assert cpu_engine_options({"kv_cache_memory_bytes": 7}, 123)["kv_cache_memory_bytes"] == 7


def test_a_kv_cache_that_does_not_fit_in_free_memory_names_the_key() -> None:
    check_cpu_memory(GIB, GIB, 3 * GIB)
    check_cpu_memory(GIB, GIB, None)  # unknown: not checked
    with pytest.raises(EngineError, match=r"rollout.engine.cpu_kv_cache_gib") as info:
        check_cpu_memory(4 * GIB, GIB, 2 * GIB)
    assert "4.00 GiB of KV cache" in str(info.value) and "2.00 GiB" in str(info.value)


def test_a_head_size_the_cpu_attention_does_not_serve_is_refused_before_start() -> None:
    supported = [32, 64, 128]
    check_head_size(tiny_config("qwen2", num_attention_heads=2), supported)  # 64 / 2 = 32
    with pytest.raises(EngineError, match="head size 16 .*32, 64, 128"):
        check_head_size(tiny_config("qwen2"), supported)  # 64 / 4 = 16
    check_head_size(tiny_config("qwen2"), None)  # the backend does not say: not checked
