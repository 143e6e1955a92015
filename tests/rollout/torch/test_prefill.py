"""Packed prefill (frlab.rollout.torch.prefill): the plan's hand-computed choices, a packed
row's cache split into the padded layout, packed and padded engines sampling the same tokens
and log-probs (sdpa, eager, MoE routing), and the fall-backs where packing is not exact."""

from __future__ import annotations

import asyncio
import logging

import pytest
import torch
from helpers.models import policy_of
from helpers.torch_engine import VOCAB, recomputed_log_probs, tiny_model
from transformers import Qwen2Config, Qwen2ForCausalLM

from frlab.defaults import sampling_params, torch_engine
from frlab.model.policy import tiny_config
from frlab.model.routing_replay import moe_routers, record_routing
from frlab.rollout.torch import prefill
from frlab.rollout.torch.engine import TorchEngine
from frlab.rollout.torch.kv_batch import GrowingCache, left_pad, unpack_rows
from frlab.rollout.torch.prefill import PrefillCost, plan

PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11, 12], [4, 4], [30, 31, 32, 33], [9] * 17, [2, 7]]


def run(engine: TorchEngine, prompts, params):
    async def go():
        return await asyncio.gather(*engine.generate_many(list(zip(prompts, params, strict=True))))

    with engine:
        return asyncio.run(go())


def prefill_inputs(engine: TorchEngine) -> list[torch.Tensor]:
    """Input ids of every forward with more than one new token per row (the prefills)."""
    seen: list[torch.Tensor] = []
    engine.model.register_forward_hook(
        lambda m, a, kw, out: (
            seen.append(kw["input_ids"]) if kw["input_ids"].shape[1] > 1 else None
        ),
        with_kwargs=True,
    )
    return seen


# -- the plan --------------------------------------------------------------------------------
def test_without_a_cost_everything_is_one_padded_forward() -> None:
    assert plan([3, 8, 2], None) == [([0, 1, 2], False)]


def test_ragged_prompts_pack_equal_ones_pad() -> None:
    cost = PrefillCost(linear=1000.0, attention=1.0)
    # ragged: padded 2*30*(1000+30) = 61800 > packed 32*(1000+32) = 33024
    assert cost.padded([2, 30]) == 61800 and cost.packed([2, 30]) == 33024
    assert plan([2, 30], cost) == [([0, 1], True)]
    # equal: padded 60*1030 = 61800 < packed 60*1060 = 63600 (the row's attention is wider)
    assert plan([30, 30], cost) == [([0, 1], False)]
    assert plan([5], cost) == [([0], False)]  # one prompt has no padding to save


def test_packed_rows_are_cut_at_max_pack_tokens_and_the_rest_padded_together() -> None:
    cost = PrefillCost(linear=4000.0, attention=4.0)  # 0.25 * 1000 = 250 < the floor 256
    assert cost.max_pack_tokens == prefill.MIN_PACK_TOKENS == 256
    assert PrefillCost(linear=4000.0, attention=1.0).max_pack_tokens == 1000
    assert PrefillCost(linear=8e6, attention=4.0).max_pack_tokens == prefill.MAX_PACK_TOKENS
    # rows of 250 | 110 (+300 > 256) | 300 | 1: the last two alone would not pack, so they
    # join one padded forward
    assert plan([200, 50, 10, 100, 300, 1], cost) == [
        ([0, 1], True),
        ([2, 3], True),
        ([4, 5], False),
    ]
    # equal lengths never pack; cut at the row limit they are still one padded forward
    assert plan([200] * 5, cost) == [([0, 1, 2, 3, 4], False)]


def test_moe_cost_counts_the_routed_share_of_the_experts() -> None:
    cfg = tiny_config("qwen3_moe", vocab_size=VOCAB)  # 4 experts, 2 per token, 2 layers
    model = policy_of(config=cfg, seed=0)
    assert prefill.active_expert_share(cfg) == 0.5
    embeddings = {id(p) for p in model.get_input_embeddings().parameters()}
    embeddings |= {id(p) for p in model.get_output_embeddings().parameters()}
    every = sum(p.numel() for p in model.parameters() if id(p) not in embeddings)
    h, m = cfg.hidden_size, cfg.moe_intermediate_size
    experts = cfg.num_hidden_layers * cfg.num_experts * 3 * h * m  # gate, up, down
    assert PrefillCost.of(model).linear == 2 * (every - experts + experts * 0.5)


def test_cost_of_a_model_counts_its_weights_and_attention() -> None:
    model = tiny_model(0)  # hidden 32, MLP 64, 2 layers, 4 heads of 8, 2 kv heads, vocab 64
    per_layer = (32 * 32 + 32) + 2 * (32 * 16 + 16) + 32 * 32 + 3 * 32 * 64 + 2 * 32
    cost = PrefillCost.of(model)
    assert cost.linear == 2 * (2 * per_layer + 32)  # + the final norm; embeddings excluded
    assert cost.attention == 4 * 4 * 8 * 2


# -- the packed row --------------------------------------------------------------------------
def test_unpacked_cache_equals_the_padded_prefill() -> None:
    model, prompts = tiny_model(1), [[1, 2, 3], [5, 6, 7, 8, 9], [4, 4]]
    ids, attention, positions = left_pad(prompts, torch.device("cpu"))
    padded, packed = GrowingCache(), GrowingCache()
    with torch.no_grad():
        out = model(
            input_ids=ids,
            attention_mask=attention,
            position_ids=positions,
            cache=padded,
            use_cache=True,
        )
        pids, ppos, last = prefill.packed_inputs(prompts, torch.device("cpu"))
        assert pids.tolist() == [sum(prompts, [])] and last.tolist() == [2, 7, 9]
        assert ppos.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4, 0, 1]]
        pout = model(
            input_ids=pids,
            attention_mask=prefill.packed_mask(model, ppos),
            position_ids=ppos,
            cache=packed,
            use_cache=True,
        )
    torch.testing.assert_close(pout.logits[0, last], out.logits[:, -1], atol=1e-5, rtol=0)
    unpacked, mask = unpack_rows(packed, [len(p) for p in prompts])
    assert torch.equal(mask, attention)
    real = attention.bool()[:, None, :, None]
    for a, b in zip(padded.growing_layers(), unpacked.growing_layers(), strict=True):
        for x, y in ((a.keys, b.keys), (a.values, b.values)):
            assert x.shape == y.shape
            torch.testing.assert_close(y * real, x * real, atol=1e-5, rtol=0)
            assert not bool((y * ~real).any())  # padding columns are zeros


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_and_padded_engines_sample_the_same(attn: str) -> None:
    model = tiny_model(3, sharpness=2.0)  # flat: a shifted draw would show
    model.set_attn_implementation(attn)
    params = [
        sampling_params(max_new_tokens=n, seed=10 + i) for i, n in enumerate([6, 2, 9, 4, 5, 7])
    ]
    packed_engine = torch_engine(model, max_batch_size=4)
    padded_engine = torch_engine(model, max_batch_size=4, packed_prefill=False)
    assert packed_engine.packed_prefill and not padded_engine.packed_prefill
    seen = prefill_inputs(packed_engine)
    packed, padded = run(packed_engine, PROMPTS, params), run(padded_engine, PROMPTS, params)
    assert seen[0].tolist() == [sum(PROMPTS[:4], [])]  # the first four, packed in one row
    for prompt, a, b in zip(PROMPTS, packed, padded, strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(
            torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-5, rtol=0
        )
        fresh = recomputed_log_probs(model, prompt, a.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(a.log_probs), fresh, atol=1e-5, rtol=0)


def test_several_packed_and_padded_groups_merge_in_one_admission(monkeypatch) -> None:
    monkeypatch.setattr(prefill, "MIN_PACK_TOKENS", 10)
    monkeypatch.setattr(prefill, "ATTENTION_SHARE", 0.0)  # rows of 10 tokens at most
    model = tiny_model(4)
    engine = torch_engine(model, max_batch_size=8, seed=2)
    assert engine.packed_prefill
    seen = prefill_inputs(engine)
    params = [sampling_params(max_new_tokens=n, temperature=0.9) for n in [5, 3, 6, 2, 4, 7]]
    results = run(engine, PROMPTS, params)
    # [3] alone (padded) | [8, 2] packed | [4], [17], [2] would not pack: one padded forward
    padded = [[0] * (17 - len(p)) + p for p in PROMPTS[3:]]
    assert [x.tolist() for x in seen] == [[PROMPTS[0]], [PROMPTS[1] + PROMPTS[2]], padded]
    for prompt, p, res in zip(PROMPTS, params, results, strict=True):
        assert len(res.token_ids) == p.max_new_tokens
        fresh = recomputed_log_probs(model, prompt, res.token_ids, 0.9)
        torch.testing.assert_close(torch.tensor(res.log_probs), fresh, atol=1e-5, rtol=0)


def test_a_packed_group_joins_a_batch_that_is_already_decoding() -> None:
    model = tiny_model(6, sharpness=2.0)
    engine = torch_engine(model, max_batch_size=8, seed=1)
    seen = prefill_inputs(engine)
    decodes: list[int] = []
    engine.model.register_forward_hook(
        lambda m, a, kw, out: decodes.append(len(seen)) if kw["input_ids"].shape[1] == 1 else None,
        with_kwargs=True,
    )

    async def go():
        (long,) = engine.generate_many([([3, 1, 4, 1, 5], sampling_params(max_new_tokens=40))])
        while not decodes:
            await asyncio.sleep(0.001)
        later = engine.generate_many([(p, sampling_params(max_new_tokens=6)) for p in PROMPTS[:3]])
        return [await long, *(await asyncio.gather(*later))]

    with engine:
        results = asyncio.run(go())
    assert seen[1].tolist() == [sum(PROMPTS[:3], [])]  # packed, after decoding had begun
    assert decodes[0] == 1 and len(results[0].token_ids) == 40
    for prompt, res in zip([[3, 1, 4, 1, 5], *PROMPTS[:3]], results, strict=True):
        fresh = recomputed_log_probs(model, prompt, res.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(res.log_probs), fresh, atol=1e-5, rtol=0)


class _NoLogitsToKeep(Qwen2ForCausalLM):
    """A model whose forward cannot trim its logits (all positions come back)."""

    def forward(
        self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=None
    ):
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
        )


def test_a_model_without_logits_to_keep_is_packed_through_its_full_logits() -> None:
    model = _NoLogitsToKeep(tiny_model(7).config).eval()
    engine = torch_engine(model, max_batch_size=4)
    assert engine.packed_prefill and "logits_to_keep" not in engine._forward_extra
    seen = prefill_inputs(engine)
    params = [sampling_params(max_new_tokens=4, temperature=0.9)] * 3
    results = run(engine, PROMPTS[:3], params)
    assert seen[0].tolist() == [sum(PROMPTS[:3], [])]
    for prompt, res in zip(PROMPTS[:3], results, strict=True):
        fresh = recomputed_log_probs(model, prompt, res.token_ids, 0.9)
        torch.testing.assert_close(torch.tensor(res.log_probs), fresh, atol=1e-5, rtol=0)


def test_packed_prefill_records_each_prompts_own_moe_routing() -> None:
    cfg = tiny_config("qwen3_moe", vocab_size=VOCAB, num_experts=8, num_experts_per_tok=2)
    model = policy_of(config=cfg, seed=0).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for router in moe_routers(model):
            router.weight.copy_(torch.randn(router.weight.shape, generator=gen) * 0.5)
    engine = torch_engine(model, max_batch_size=4, record_routing=True)
    seen = prefill_inputs(engine)
    prompts = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11, 12, 13], [4, 4]]
    results = run(engine, prompts, [sampling_params(max_new_tokens=3)] * 3)
    assert [tuple(x.shape) for x in seen] == [(1, 14)]  # packed
    for prompt, res in zip(prompts, results, strict=True):
        with torch.no_grad(), record_routing(model) as rec:
            model(input_ids=torch.tensor([prompt + res.token_ids[:-1]]))
        expected = rec.indices()[0]
        assert torch.equal(res.routing.sort(-1).values, expected.sort(-1).values)
        assert not res.routing.is_inference()  # the learner indexes with it under autograd


# -- fall-backs ------------------------------------------------------------------------------
def test_sliding_window_models_are_prefilled_padded(caplog) -> None:
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=0,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    assert "sliding_attention" in cfg.layer_types
    with caplog.at_level(logging.WARNING):
        engine = torch_engine(model)
    assert not engine.packed_prefill
    assert "sliding-window" in caplog.text


def test_a_packed_mask_that_leaks_across_prompts_is_caught_at_start(monkeypatch, caplog) -> None:
    """The start check compares a packed forward with separate ones: a mask letting the second
    prompt see the first one's tokens (a plain causal mask over the row) turns packing off."""

    def leaky(model, positions):
        n = positions.shape[1]
        return torch.ones((n, n), dtype=torch.bool).tril()[None, None]

    monkeypatch.setattr(prefill, "packed_mask", leaky)
    model = tiny_model(5)
    with caplog.at_level(logging.WARNING):
        engine = torch_engine(model)
    assert not engine.packed_prefill
    assert "logit gap" in caplog.text
    (res,) = run(engine, [PROMPTS[1]], [sampling_params(max_new_tokens=3, temperature=0.8)])
    fresh = recomputed_log_probs(model, PROMPTS[1], res.token_ids, 0.8)
    torch.testing.assert_close(torch.tensor(res.log_probs), fresh, atol=1e-5, rtol=0)
