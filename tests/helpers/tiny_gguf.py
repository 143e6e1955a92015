"""A tiny Llama GGUF (byte-level vocabulary, chat template, float32 tensors) for offline tests.

Written with the `gguf` package (extra `gguf`) under llama.cpp's key and tensor names, so that
transformers loads it through the same code path as a downloaded GGUF.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 16, 2, 4, 2, 32
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_vocab() -> list[str]:
    """Special tokens, the 256 byte-level characters, then one token per merge."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    chars = sorted(bytes_to_unicode().values())
    return SPECIAL + chars + [m.replace(" ", "") for m in MERGES]


def _tensors(vocab: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    head_dim = HIDDEN // HEADS

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    out = {"token_embd.weight": w(vocab, HIDDEN), "output_norm.weight": 1 + w(HIDDEN)}
    for i in range(LAYERS):
        p = f"blk.{i}."
        out.update(
            {
                p + "attn_norm.weight": 1 + w(HIDDEN),
                p + "ffn_norm.weight": 1 + w(HIDDEN),
                p + "attn_q.weight": w(HIDDEN, HIDDEN),
                p + "attn_k.weight": w(KV_HEADS * head_dim, HIDDEN),
                p + "attn_v.weight": w(KV_HEADS * head_dim, HIDDEN),
                p + "attn_output.weight": w(HIDDEN, HIDDEN),
                p + "ffn_gate.weight": w(FFN, HIDDEN),
                p + "ffn_up.weight": w(FFN, HIDDEN),
                p + "ffn_down.weight": w(HIDDEN, FFN),
            }
        )
    return out


def write_tiny_gguf(path: Path, seed: int = 0) -> Path:
    """Write a random tiny Llama GGUF (tied embeddings) with a byte-level BPE tokenizer."""
    import gguf

    tokens = byte_vocab()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-test-llama")
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL)))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, array in _tensors(len(tokens), np.random.default_rng(seed)).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
