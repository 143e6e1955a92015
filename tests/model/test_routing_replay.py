"""Rollout routing replay on a tiny random-init Qwen3-MoE (frlab.model.routing_replay)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from frlab.model.lm_logprobs import sequence_logprobs
from frlab.model.policy import enable_checkpointing, tiny_config
from frlab.model.routing_replay import (
    moe_routers,
    pad_routing,
    record_routing,
    replay_routing,
)

# 16 experts, top-2, so a short sequence leaves experts unused in every layer (test_exact_...).
NUM_EXPERTS, TOP_K, SEQ = 16, 2, 10


def tiny_moe(seed: int = 0, **overrides) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = tiny_config("qwen3_moe", num_experts=NUM_EXPERTS, num_experts_per_tok=TOP_K, **overrides)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():  # HF inits routers to zero: make routing and experts matter
        for router in moe_routers(model):
            router.weight.normal_(0.0, 0.5)
        for module in model.modules():
            if type(module).__name__ == "Qwen3MoeExperts":
                module.gate_up_proj.normal_(0.0, 0.1)
                module.down_proj.normal_(0.0, 0.1)
    return model


def token_logprobs(model: torch.nn.Module, ids: torch.Tensor, mask=None) -> torch.Tensor:
    """log pi(y_t | y_<t) for t >= 1, shape [B, T-1]."""
    logits = model(input_ids=ids, attention_mask=mask).logits.float()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_moe()


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(0, 256, (1, SEQ), generator=torch.Generator().manual_seed(1))


def test_record_shape_and_replay_same_forward_is_bitwise_equal(model, ids):
    """Replaying the routing of the same forward reproduces its log-probs bit for bit."""
    with torch.no_grad(), record_routing(model) as rec:
        plain = token_logprobs(model, ids)
    routing = rec.indices()
    assert routing.shape == (1, SEQ, 2, TOP_K) and routing.dtype == torch.int16
    assert int(routing.min()) >= 0 and int(routing.max()) < NUM_EXPERTS
    with torch.no_grad(), replay_routing(model, routing[0]):
        replayed = token_logprobs(model, ids)
    assert torch.equal(replayed, plain)


def test_replay_forces_experts_and_router_still_gets_gradients(model, ids):
    """Forcing other experts changes the output; the router weight receives gradients."""
    with torch.no_grad(), record_routing(model) as rec:
        plain = token_logprobs(model, ids)
    other = (rec.indices().long() + TOP_K) % NUM_EXPERTS  # disjoint from the chosen experts
    learner = copy.deepcopy(model)
    with replay_routing(learner, other), record_routing(learner) as seen:
        replayed = token_logprobs(learner, ids)
        replayed.sum().backward()
    assert torch.equal(seen.indices().long(), other)  # the replayed experts were used
    assert (replayed.detach() - plain).abs().max() > 1e-3
    for router in moe_routers(learner):
        assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


def test_exact_replay_under_router_perturbation(model, ids):
    """Learner = sampler's weights, except one router row per layer boosted.

    The boosted expert is one the sampler never chose in that layer on this sequence. So
    without replay the learner routes many tokens to it and its log-probs move; with replay it
    uses the sampler's experts S, and with `norm_topk_prob` their weights
    p_i / sum_{j in S} p_j = exp(l_i) / sum_{j in S} exp(l_j) do not involve the boosted
    logit: the log-probs equal the sampler's up to float rounding of the full softmax
    denominator (far below 1e-5), while the unreplayed difference is orders larger.
    """
    with torch.no_grad(), record_routing(model) as rec:
        sampler = token_logprobs(model, ids)
    routing = rec.indices()
    learner = copy.deepcopy(model)
    with torch.no_grad():
        for layer, router in enumerate(moe_routers(learner)):
            used = set(routing[0, :, layer].flatten().tolist())
            unused = min(set(range(NUM_EXPERTS)) - used)
            router.weight[unused] += 3.0 * router.weight.mean(0) + 0.5
    with torch.no_grad(), record_routing(learner) as drift:
        plain = token_logprobs(learner, ids)
    assert not torch.equal(drift.indices(), routing)  # some top-k selections flipped
    with torch.no_grad(), replay_routing(learner, routing):
        replayed = token_logprobs(learner, ids)
    gap_plain = (plain - sampler).abs().max().item()
    gap_replay = (replayed - sampler).abs().max().item()
    assert gap_plain > 1e-2
    assert gap_replay < 1e-5
    assert gap_replay < gap_plain / 1000


def test_kv_cache_decoding_records_same_routing_as_full_forward(model, ids):
    """Prefill + one-token decode steps record, step by step, the full forward's experts."""
    prompt = 4
    with torch.no_grad(), record_routing(model) as full:
        model(input_ids=ids)
    with torch.no_grad(), record_routing(model) as inc:
        cache = DynamicCache()
        model(input_ids=ids[:, :prompt], cache=cache, use_cache=True)
        for t in range(prompt, SEQ):
            model(input_ids=ids[:, t : t + 1], cache=cache, use_cache=True)
    assert [s.shape[1] for s in inc.steps] == [prompt] + [1] * (SEQ - prompt)
    assert torch.equal(inc.indices(), full.indices())


def test_generate_records_prompt_and_all_but_last_token(model, ids):
    """HF `generate` feeds back every sampled token but the last: T_total - 1 routed tokens."""
    with torch.no_grad(), record_routing(model) as rec:
        out = model.generate(ids[:, :4], max_new_tokens=5, do_sample=False, min_new_tokens=5)
    with torch.no_grad(), record_routing(model) as full:
        model(input_ids=out)
    assert rec.indices().shape[1] == out.shape[1] - 1
    assert torch.equal(rec.indices(), full.indices()[:, :-1])


def test_padded_batch_replay_matches_single_sequences(model, ids):
    """Right-padded [B, T] learner batch with `pad_routing`: replay = each sequence alone."""
    seqs = [ids[:, :SEQ], ids[:, 2:7]]
    singles, routings = [], []
    for s in seqs:
        with torch.no_grad(), record_routing(model) as rec:
            singles.append(token_logprobs(model, s)[0])
        routings.append(rec.indices()[0, :-1])  # as from generate: last token not routed
    batch = torch.zeros(2, SEQ, dtype=torch.long)
    mask = torch.zeros(2, SEQ, dtype=torch.long)
    for row, s in enumerate(seqs):
        batch[row, : s.shape[1]], mask[row, : s.shape[1]] = s[0], 1
    routing = pad_routing(routings, SEQ)
    assert routing.shape == (2, SEQ, 2, TOP_K)
    with torch.no_grad(), replay_routing(model, routing):
        lp = token_logprobs(model, batch, mask)
    for row, single in enumerate(singles):
        torch.testing.assert_close(lp[row, : single.shape[0]], single, rtol=0, atol=1e-5)


def test_patches_are_removed_on_exit_even_after_errors(model, ids):
    routers = moe_routers(model)
    with torch.no_grad(), record_routing(model) as rec:
        model(input_ids=ids)
    assert all("forward" not in r.__dict__ for r in routers)
    assert not model._forward_pre_hooks
    with pytest.raises(RuntimeError, match="boom"), replay_routing(model, rec.indices()):
        assert all("forward" in r.__dict__ for r in routers)
        raise RuntimeError("boom")
    assert all("forward" not in r.__dict__ for r in routers)
    other = (rec.indices().long() + 1) % NUM_EXPERTS
    with torch.no_grad():
        with replay_routing(model, other):
            forced = model(input_ids=ids).logits
        after = model(input_ids=ids).logits
        with record_routing(model) as again:
            model(input_ids=ids)
    assert not torch.equal(forced, after)
    assert torch.equal(again.indices(), rec.indices())


def test_bad_routing_is_refused_with_a_clear_error(model, ids):
    good = torch.zeros(1, SEQ, 2, TOP_K, dtype=torch.long)
    with pytest.raises(ValueError, match="expected"):
        with replay_routing(model, good[:, :, :1]):
            pass
    with pytest.raises(ValueError, match="outside"):
        with replay_routing(model, good + NUM_EXPERTS):
            pass
    with pytest.raises(ValueError, match="integer"):
        with replay_routing(model, good.float()):
            pass
    with pytest.raises(ValueError, match="tokens"), replay_routing(model, good[:, :3]):
        model(input_ids=ids)
    with pytest.raises(ValueError, match="no sparse MoE"):
        moe_routers(torch.nn.Linear(2, 2))


def test_unnormalised_weights_and_dense_layers():
    """bf16, `norm_topk_prob=False`: replay is bitwise too; dense `mlp_only_layers` don't count."""
    model = tiny_moe(seed=4, norm_topk_prob=False, mlp_only_layers=[0]).to(torch.bfloat16)
    ids = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(5))
    with torch.no_grad(), record_routing(model) as rec:
        plain = token_logprobs(model, ids)
    assert rec.indices().shape == (2, 6, 1, TOP_K)
    with torch.no_grad(), replay_routing(model, rec.indices()):
        assert torch.equal(token_logprobs(model, ids), plain)


def test_gradient_checkpointing_replays_in_the_recomputed_forward(model, ids):
    """With checkpointing, backward inside the context recomputes with the replayed experts."""
    with torch.no_grad(), record_routing(model) as rec:
        model(input_ids=ids)
    other = (rec.indices().long() + TOP_K) % NUM_EXPERTS
    grads = []
    for checkpointing in (False, True):
        learner = copy.deepcopy(model).train()
        if checkpointing:
            enable_checkpointing(learner)
        with replay_routing(learner, other):
            token_logprobs(learner, ids).sum().backward()
        grads.append(torch.cat([r.weight.grad.flatten() for r in moe_routers(learner)]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)


def test_learner_path_with_replay_matches_sampler_under_router_perturbation(model, ids):
    """The learner's `sequence_logprobs` on a right-padded batch, perturbed routers (as in
    test_exact_...): with replayed sampler routing it reproduces the sampler's log-probs."""
    seqs = [ids[0], ids[0, 1:8]]
    sampler, routings = [], []
    for s in seqs:
        with torch.no_grad(), record_routing(model) as rec:
            sampler.append(token_logprobs(model, s[None])[0])
        routings.append(rec.indices()[0, :-1])
    learner = copy.deepcopy(model)
    with torch.no_grad():
        for layer, router in enumerate(moe_routers(learner)):
            used = {int(e) for r in routings for e in r[:, layer].flatten()}
            unused = min(set(range(NUM_EXPERTS)) - used)
            router.weight[unused] += 3.0 * router.weight.mean(0) + 0.5
    batch = torch.zeros(2, SEQ, dtype=torch.long)
    mask = torch.zeros(2, SEQ, dtype=torch.bool)
    for row, s in enumerate(seqs):
        batch[row, : s.numel()], mask[row, : s.numel()] = s, True
    with torch.no_grad():
        plain, _ = sequence_logprobs(learner, batch, mask)
        with replay_routing(learner, pad_routing(routings, SEQ)):
            replayed, _ = sequence_logprobs(learner, batch, mask)
    gaps_plain, gaps_replay = [], []
    for row, ref in enumerate(sampler):
        n = ref.numel()
        gaps_plain.append((plain[row, 1 : n + 1] - ref).abs().max().item())
        gaps_replay.append((replayed[row, 1 : n + 1] - ref).abs().max().item())
    assert max(gaps_plain) > 1e-2
    assert max(gaps_replay) < 1e-5
