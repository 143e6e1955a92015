"""toy_single is learnable: on-policy REINFORCE with a batch-mean baseline (FlashREINFORCE at
lag 0: rho = 1, every trajectory admitted) takes a tiny random-init Qwen2 from chance to
>= 0.8 reward in ~100 updates of 32 one-token replies."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from envs.toy import ParityEnv
from frlab.model.toy_tokenizer import build_toy_tokenizer


@pytest.mark.slow
def test_toy_single_goes_from_chance_to_solved() -> None:
    torch.manual_seed(0)
    tok, env, rng = build_toy_tokenizer(), ParityEnv(), random.Random(0)
    sampler = ParityEnv.task_sampler()
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=64,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
    )
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    rewards: list[float] = []
    for _ in range(120):
        tasks = [sampler.sample(rng) for _ in range(32)]
        prompts = torch.tensor(
            [
                tok.apply_chat_template(env.reset(t), add_generation_prompt=True)["input_ids"]
                for t in tasks
            ]
        )
        log_probs = torch.log_softmax(model(input_ids=prompts).logits[:, -1].float(), dim=-1)
        replies = torch.multinomial(log_probs.exp().detach(), 1).squeeze(1)
        r = []
        for task, reply in zip(tasks, replies.tolist(), strict=True):
            env.reset(task)
            r.append(env.step(tok.decode([reply], skip_special_tokens=True)).reward)
        reward = torch.tensor(r)
        advantage = reward - reward.mean()
        loss = -(advantage * log_probs.gather(1, replies[:, None]).squeeze(1)).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        rewards.append(reward.mean().item())
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert first <= 0.3, rewards[:10]
    assert last >= 0.8, rewards[-20:]
