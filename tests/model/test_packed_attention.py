"""Packed (padding-free) forwards equal padded ones: log-probs, entropies and gradients.

Float64 tiny models of each target architecture. `sdpa` packed runs transformers' own
`sdpa_attention_forward` per trajectory, so it matches the padded sdpa forward to float64
rounding; transformers' `eager` attention takes its softmax in float32, so an eager model's
padded forward differs from the packed (sdpa) one at float32 rounding. Also checked here: what
transformers itself does with packed `position_ids` (the dense block-diagonal mask), that a
packed forward outside `packed_attention` is refused, and that activation checkpointing (the
forward recomputed inside the backward) stays exact.
"""

from __future__ import annotations

import pytest
import torch
from helpers.models import policy_of

from frlab.model.lm_logprobs import packed_index, sequence_logprobs
from frlab.model.packed_attention import (
    PACKED_SDPA,
    check_packable,
    packed_attention,
    packed_sdpa_attention,
)
from frlab.model.policy import enable_checkpointing, tiny_config
from frlab.model.routing_replay import record_routing, replay_routing

VOCAB = 96
LENGTHS = [5, 17, 9, 2, 30, 1, 17, 5, 5]  # equal lengths share one batched attention call


def _model(arch: str, attn: str) -> torch.nn.Module:
    config = tiny_config(arch, vocab_size=VOCAB)
    if arch == "qwen3_moe":
        config._experts_implementation = "eager"  # grouped_mm has no float64 kernel
    return policy_of(config=config, seed=0, attn_implementation=attn).to(torch.float64)


def _batch(lengths=LENGTHS, seed: int = 3):
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    mask = torch.arange(width)[None] < torch.tensor(lengths)[:, None]
    ids = torch.where(mask, torch.randint(0, VOCAB, (len(lengths), width), generator=gen), 0)
    action = mask.clone()
    action[:, 0] = False
    return ids, mask, action


def _run(model, ids, mask, action, *, pack: bool):
    """Log-probs, entropies and parameter gradients of a weighted sum of the log-probs."""
    model.zero_grad(set_to_none=True)
    context = packed_attention(model) if pack else torch.enable_grad()
    with context:
        lp, ent = sequence_logprobs(
            model, ids, mask, action_mask=action, compute_entropy=True, chunk_size=7, pack=pack
        )
        weights = torch.linspace(0.1, 1.0, ids.shape[1], dtype=lp.dtype)
        (lp * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach(), ent, grads


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3_moe"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_equals_padded(arch: str, attn: str) -> None:
    model = _model(arch, attn)
    ids, mask, action = _batch()
    padded = _run(model, ids, mask, action, pack=False)
    packed = _run(model, ids, mask, action, pack=True)
    assert model.config._attn_implementation == attn  # restored after the packed forward
    tol = 1e-12 if attn == "sdpa" else 1e-6
    for got, want in zip(packed[:2], padded[:2], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=tol)
    assert packed[2].keys() == padded[2].keys() and len(padded[2]) > 10
    for name, grad in padded[2].items():
        torch.testing.assert_close(packed[2][name], grad, rtol=tol, atol=tol, msg=name)


def test_order_of_trajectories_in_a_row_does_not_matter() -> None:
    model = _model("qwen2", "sdpa")
    ids, mask, action = _batch()
    order = torch.tensor([4, 7, 0, 5, 8, 2, 1, 6, 3])
    lp, ent, _ = _run(model, ids, mask, action, pack=True)
    lp2, ent2, _ = _run(model, ids[order], mask[order], action[order], pack=True)
    torch.testing.assert_close(lp2, lp[order], rtol=0, atol=1e-12)
    torch.testing.assert_close(ent2, ent[order], rtol=0, atol=1e-12)


def test_activation_checkpointing_recomputes_inside_the_packed_context() -> None:
    model = _model("qwen2", "sdpa")
    ids, mask, action = _batch()
    want = _run(model, ids, mask, action, pack=False)
    enable_checkpointing(model)
    model.train()
    got = _run(model, ids, mask, action, pack=True)
    for name, grad in want[2].items():
        torch.testing.assert_close(got[2][name], grad, rtol=1e-12, atol=1e-12, msg=name)


def test_packed_routing_replay_equals_padded_replay() -> None:
    """MoE routing replay: the recorded `[B, T, L, k]` experts of the real tokens, packed in
    the same order as the tokens, force the same experts as the padded replay."""
    model = _model("qwen3_moe", "sdpa")
    ids, mask, action = _batch()
    with torch.no_grad(), record_routing(model) as record:
        model(input_ids=ids, attention_mask=mask.long(), use_cache=False)
    routing = record.indices()
    # Perturb the experts so that replay (not the router's own choice) decides the output.
    routing = torch.where(mask[:, :, None, None], (routing + 1) % 4, routing)
    routing = torch.where(routing[..., :1] == routing[..., 1:], (routing + 2) % 4, routing)
    with replay_routing(model, routing):
        padded = _run(model, ids, mask, action, pack=False)
    with replay_routing(model, routing[mask].unsqueeze(0)):
        packed = _run(model, ids, mask, action, pack=True)
    free = _run(model, ids, mask, action, pack=False)
    assert (free[0] - padded[0]).abs().max() > 1e-3  # the forced experts changed the output
    torch.testing.assert_close(packed[0], padded[0], rtol=0, atol=1e-12)
    for name, grad in padded[2].items():
        torch.testing.assert_close(packed[2][name], grad, rtol=1e-12, atol=1e-12, msg=name)


def test_transformers_packed_position_ids_give_a_block_diagonal_mask() -> None:
    """What transformers does by itself: with `attention_mask=None`, position ids that restart
    mark new sequences (`find_packed_sequence_indices`) and sdpa gets a block-diagonal causal
    mask, so the hidden states equal those of each sequence alone, but only without a KV cache
    (`use_cache=False`): with one, the packing goes undetected and sequences attend to each
    other. frlab does not use this path on sdpa/eager models (the mask is dense: N^2 for the
    whole row), but it is exact too."""
    from transformers.masking_utils import find_packed_sequence_indices

    model = _model("qwen2", "sdpa")
    ids, mask, _ = _batch()
    positions = (mask.long().cumsum(1) - 1).clamp_min(0)
    assert find_packed_sequence_indices(positions[mask][None]).tolist() == [
        [k for k, n in enumerate(LENGTHS) for _ in range(n)]
    ]
    with torch.no_grad():
        alone = model.model(input_ids=ids, attention_mask=mask.long(), position_ids=positions)
        row = {"input_ids": ids[mask][None], "position_ids": positions[mask][None]}
        packed = model.model(**row, use_cache=False)
        cached = model.model(**row, use_cache=True)
    want = alone.last_hidden_state[mask]
    torch.testing.assert_close(packed.last_hidden_state[0], want, rtol=0, atol=1e-12)
    assert (cached.last_hidden_state[0] - want).abs().max() > 1e-3


def test_packed_forward_outside_the_context_is_refused() -> None:
    model = _model("qwen2", "sdpa")
    ids, mask, action = _batch()
    with pytest.raises(ValueError, match="packed_attention"):
        sequence_logprobs(model, ids, mask, action_mask=action, pack=True)


def test_left_padding_is_refused_when_packing() -> None:
    model = _model("qwen2", "sdpa")
    ids, mask, action = _batch()
    with pytest.raises(ValueError, match="right-padded"), packed_attention(model):
        sequence_logprobs(model, ids, mask.flip(1), action_mask=None, pack=True)


def test_packed_index_is_row_major_over_real_tokens() -> None:
    mask = torch.tensor([[True, True, False], [True, True, True], [True, False, False]])
    assert packed_index(mask).tolist() == [[0, 1, -1], [2, 3, 4], [5, -1, -1]]


def test_unsupported_attention_is_refused_naming_the_key() -> None:
    model = _model("qwen2", "sdpa")
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match=r"data\.pack_sequences.*flex_attention"):
        check_packable(model)


def test_packed_sdpa_refuses_calls_it_cannot_make_exact() -> None:
    q = torch.zeros(1, 2, 6, 4)
    module = torch.nn.Module()
    with pytest.raises(ValueError, match="cu_seq_lens_q"):
        packed_sdpa_attention(module, q, q, q, None)
    bounds = torch.tensor([0, 2, 6])
    with pytest.raises(ValueError, match="padding mask"):
        packed_sdpa_attention(module, q, q, q, torch.ones(1, 1, 6, 6), cu_seq_lens_q=bounds)
    with pytest.raises(ValueError, match="sliding_window"):
        packed_sdpa_attention(module, q, q, q, None, cu_seq_lens_q=bounds, sliding_window=4)
    with pytest.raises(ValueError, match="partition"):
        packed_sdpa_attention(module, q, q, q, None, cu_seq_lens_q=torch.tensor([0, 2, 5]))
    assert PACKED_SDPA not in ("sdpa", "eager")
