"""Helpers shared by the torch engine tests: a tiny random Qwen2 and fresh-forward log-probs."""

from __future__ import annotations

import asyncio

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

VOCAB = 64


def tiny_model(seed: int, sharpness: float = 40.0) -> Qwen2ForCausalLM:
    """A random 2-layer Qwen2 whose LM head is scaled up so its distributions are far from
    uniform."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
    return model


def recomputed_log_probs(
    model, prompt: list[int], tokens: list[int], temperature: float
) -> torch.Tensor:
    """Log-probs of `tokens` after `prompt` from one fresh full forward (no cache, no padding)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)[len(prompt) - 1 : -1]
    return logp.gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1)


async def generate_all(engine, prompts, params):
    return await asyncio.gather(
        *[engine.generate(p, q) for p, q in zip(prompts, params, strict=True)]
    )
