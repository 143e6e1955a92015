"""LoRA policies (frlab.model.lora, built with peft): only adapters train and are pushed; the
adapted model starts as the base model (the learner's log-probs unchanged); an adapter-only
push lands on both torch engines (their log-probs change and match the learner's); the
modules adapted on dense and MoE models; bad settings name their key."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
from helpers.models import policy_of

from frlab.config.schema import LoraConfig
from frlab.defaults import sampling_params, torch_engine
from frlab.model.lm_logprobs import sequence_logprobs
from frlab.model.lora import adapted_modules, adapter_state_dict, check_lora, is_adapter
from frlab.model.policy import tiny_config

LORA = {**dataclasses.asdict(LoraConfig()), "rank": 4, "alpha": 8.0}  # the rest as declared
PROMPT = [1, 2, 3, 4]


def policy(lora=LORA, model_type: str = "qwen2"):  # noqa: ANN001, ANN201
    config = dict(tiny_config(model_type).to_dict(), model_type=model_type)
    keep = {
        k: config[k]
        for k in (
            "model_type",
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
        )
        if k in config
    }
    if model_type == "qwen3_moe":
        keep.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    return policy_of(config=keep, seed=0, lora=lora)


def log_probs(model, tokens: list[int]) -> torch.Tensor:  # noqa: ANN001
    ids = torch.tensor([PROMPT + tokens])
    with torch.no_grad():
        out, _ = sequence_logprobs(model, ids, torch.ones_like(ids))
    return out[0, len(PROMPT) :]


def test_only_the_adapters_train_and_the_adapted_model_starts_as_the_base() -> None:
    base, adapted = policy(lora=None), policy()
    trainable = [n for n, p in adapted.named_parameters() if p.requires_grad]
    assert trainable and all(is_adapter(n) for n in trainable)
    frozen = [n for n, p in adapted.named_parameters() if not p.requires_grad]
    assert frozen and not any(is_adapter(n) for n in frozen)
    tokens = [5, 9, 2, 7]
    assert torch.equal(log_probs(base, tokens), log_probs(adapted, tokens))  # B starts at 0
    names = adapted_modules(adapted)
    for part in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        assert any(n.endswith(part) for n in names), part
    assert not any("lm_head" in n for n in names)


def test_moe_experts_are_adapted_and_routers_never() -> None:
    base, adapted = policy(lora=None, model_type="qwen3_moe"), policy(model_type="qwen3_moe")
    names = adapted_modules(adapted)
    assert any(n.endswith("q_proj") for n in names) and any(
        n.endswith("mlp.experts") for n in names
    )
    assert not any(n.endswith(("mlp.gate", "router")) for n in names), names
    tokens = [5, 9, 2, 7]
    assert torch.allclose(log_probs(base, tokens), log_probs(adapted, tokens), atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("engine_kind", ["torch", "torch_process"])
def test_an_adapter_only_push_lands_and_matches_the_learners_log_probs(engine_kind: str) -> None:
    from frlab.defaults import process_engine, torch_engine

    learner = policy()
    build = torch_engine if engine_kind == "torch" else process_engine
    engine = build(learner, max_batch_size=2)
    if engine_kind == "torch":
        assert engine.packed_prefill  # a PeftModel passes position ids on: packing stays exact
    engine.start()
    try:
        params = sampling_params(max_new_tokens=8, seed=3)

        def sample():  # noqa: ANN202
            async def go():  # noqa: ANN202
                return await engine.generate(PROMPT, params)

            return asyncio.run(go())

        before = sample()
        with torch.no_grad():  # a learner step: only the adapters move
            for p in learner.parameters():
                if p.requires_grad:
                    p.add_(0.3 * torch.randn_like(p))
        push = adapter_state_dict(learner.state_dict())
        assert push and len(push) < len(learner.state_dict())
        engine.update_weights(push, 1)
        after = sample()
    finally:
        engine.shutdown()
    assert after.versions == [1] * 8
    own = log_probs(learner, after.token_ids)
    assert (own - torch.tensor(after.log_probs)).abs().max() < 1e-4  # base + new adapters
    stale = (log_probs(learner, before.token_ids) - torch.tensor(before.log_probs)).abs().max()
    assert stale > 1e-3  # the push changed what the engine samples from


def test_a_push_of_base_weights_to_a_lora_engine_is_refused() -> None:
    from frlab.rollout.torch.common import check_update

    model = policy()
    base_name = next(n for n in model.state_dict() if not is_adapter(n))
    partial = {base_name: model.state_dict()[base_name]}
    with pytest.raises(KeyError, match="mismatch"):
        check_update(model, partial, 1)


@pytest.mark.parametrize(
    ("lora", "match"),
    [
        ({"rank": -1}, "model.lora.rank"),
        ({"rank": 4, "alpha": 0}, "model.lora.alpha"),
        ({"rank": 4, "dropout": 1.0}, "model.lora.dropout"),
        ({"rank": 4, "target_modules": "all-linear"}, "model.lora.target_modules"),
    ],
)
def test_bad_settings_name_their_key(lora: dict, match: str) -> None:
    """The declaration's ranges at preflight; the module names (not a range) by check_lora."""
    from frlab.config.compose import compose
    from frlab.config.preflight import preflight

    overrides = [f"model.lora.{k}={v}" for k, v in lora.items()]
    with pytest.raises(ValueError, match=match):
        preflight(compose(overrides))


def test_check_lora_refuses_what_no_range_says() -> None:
    with pytest.raises(ValueError, match="model.lora.target_modules"):
        check_lora({"target_modules": []})


def test_routing_replay_with_moe_adapters_gives_back_the_samplers_log_probs() -> None:
    """Qwen3-MoE with trained adapters (attention and fused experts): the torch engine records
    its experts, and the learner replaying them recomputes the behaviour log-probs exactly (no
    engine-learner drift with LoRA on MoE layers)."""
    from frlab.model.routing_replay import moe_routers, replay_routing

    learner = policy(model_type="qwen3_moe")
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for router in moe_routers(learner):
            router.weight.copy_(torch.randn(router.weight.shape, generator=gen) * 0.5)
        for p in learner.parameters():
            if p.requires_grad:  # adapters away from zero
                p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    engine = torch_engine(learner, max_batch_size=2, record_routing=True)
    engine.start()
    try:
        result = asyncio.run(engine.generate(PROMPT, sampling_params(max_new_tokens=12, seed=4)))
    finally:
        engine.shutdown()
    ids = torch.tensor([PROMPT + result.token_ids])
    routing = result.routing
    assert routing is not None and routing.shape[0] == ids.shape[1] - 1
    padded = torch.cat([routing, routing[-1:]]).unsqueeze(0)  # positions [0, T)
    with torch.no_grad(), replay_routing(learner, padded):
        replayed, _ = sequence_logprobs(learner, ids, torch.ones_like(ids))
    gap = (replayed[0, len(PROMPT) :] - torch.tensor(result.log_probs)).abs().max()
    assert float(gap) < 1e-5
