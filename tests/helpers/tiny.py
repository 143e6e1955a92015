"""The tiny random-init Qwen2 that the engine, server and memory tests build: one spelling of
its shape (no imports, so every test environment, the vLLM tiers' included, can load it)."""

from __future__ import annotations

from typing import Any


def tiny_qwen2_config(**changes: Any) -> dict[str, Any]:
    """A 2-layer Qwen2 config (hidden 32, vocab 64, grouped-query attention, tied embeddings)
    as a plain mapping (`model.config`, or `Qwen2Config(**...)`), with `changes` applied."""
    return {
        "model_type": "qwen2",
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "tie_word_embeddings": True,
        **changes,
    }
