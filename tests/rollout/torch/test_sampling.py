"""The torch engine's sampler: the two-level inverse CDF draws the same token as a flat float64
search, never a zero-probability token, with the right frequencies; batched top-k masking
equals the per-row definition."""

from __future__ import annotations

import math

import pytest
import torch

from frlab.defaults import sampling_params
from frlab.rollout.torch.sampling import (
    BLOCK,
    _inverse_cdf_flat,
    draw,
    inverse_cdf,
    sampling_log_probs,
    truncate,
    uniforms,
)


def random_log_probs(rows: int, vocab: int, seed: int, keep: int | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 4
    if keep is not None:  # a truncated distribution: many exact zeros
        kth = logits.topk(keep, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.log_softmax(logits, dim=-1)


@pytest.mark.parametrize(("vocab", "keep"), [(49152, None), (1000, None), (3 * BLOCK + 7, 5)])
def test_two_level_search_draws_what_the_flat_search_draws(vocab: int, keep) -> None:
    log_probs = random_log_probs(16, vocab, seed=vocab, keep=keep)
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        u = torch.rand(16, generator=g, dtype=torch.float64)
        assert torch.equal(inverse_cdf(log_probs, u), _inverse_cdf_flat(log_probs.exp(), u))


def test_no_zero_probability_token_at_the_ends_of_the_unit_interval() -> None:
    log_probs = random_log_probs(4, 2 * BLOCK + 3, seed=0, keep=3)
    for value in (0.0, 1.0 - 2.0**-53, 0.5):
        tokens = inverse_cdf(log_probs, torch.full((4,), value, dtype=torch.float64))
        assert torch.isfinite(log_probs.gather(1, tokens.unsqueeze(1))).all()


def test_draw_frequencies_match_the_probabilities() -> None:
    probs = torch.tensor([0.5, 0.25, 0.15, 0.0, 0.1])
    n = 20000
    log_probs = probs.log().expand(n, -1)
    u = torch.rand(n, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    counts = torch.bincount(inverse_cdf(log_probs, u), minlength=5).double()
    assert counts[3] == 0
    sigma = (n * probs * (1 - probs)).double().sqrt()
    assert ((counts - n * probs.double()).abs() <= 4 * sigma + 1e-9).all()


def test_rows_with_their_own_generator_ignore_the_shared_stream() -> None:
    own = [torch.Generator().manual_seed(5), None]
    a = uniforms(own, torch.Generator().manual_seed(0))
    b = uniforms([torch.Generator().manual_seed(5), None], torch.Generator().manual_seed(9))
    assert a[0] == b[0] and a[1] != b[1]


def test_batched_top_k_masking_equals_the_per_row_definition() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randint(-3, 4, (6, 40), generator=g).float()  # many ties
    params = [
        sampling_params(top_k=k, temperature=t)
        for k, t in [(0, 1.0), (1, 0.7), (3, 1.0), (40, 1.0), (1, 2.0), (7, 0.5)]
    ]
    params.append(sampling_params(top_k=2, top_p=0.6))
    logits = torch.cat([logits, logits[:1]])
    got = sampling_log_probs(logits, params)
    for row, p in enumerate(params):
        expected = torch.log_softmax(truncate(logits[row] / p.temperature, p.top_k, p.top_p), -1)
        assert torch.equal(got[row], expected), row
    greedy = sampling_log_probs(logits[:2], [sampling_params(top_k=1)] * 2)
    ties = (logits[:2] == logits[:2].amax(-1, keepdim=True)).sum(-1)
    kept = torch.isfinite(greedy).sum(-1)
    assert torch.equal(kept, ties)
    assert math.isclose(float(greedy[0].exp().sum()), 1.0, rel_tol=1e-6)


def test_the_greedy_fast_path_gives_what_the_general_path_gives() -> None:
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(2)) * 3
    greedy = [sampling_params(top_k=1, temperature=t) for t in (1.0, 0.5, 2.0, 1.0, 0.9)]
    shared = torch.Generator().manual_seed(0)
    tokens, chosen = draw(logits, greedy, [None] * 5, shared)
    general = sampling_log_probs(logits, greedy)
    expected = inverse_cdf(general, torch.rand(5, dtype=torch.float64))
    assert torch.equal(tokens, expected) and torch.equal(tokens, logits.argmax(-1))
    assert chosen == general.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist() == [0.0] * 5
    # one uniform per row was consumed, as on the general path
    after = torch.Generator().manual_seed(0)
    torch.rand(5, generator=after, dtype=torch.float64)
    assert torch.equal(torch.rand(1, generator=shared), torch.rand(1, generator=after))
    tied = torch.zeros(2, 4)  # ties: the general path (each tied token equally likely)
    tokens, chosen = draw(tied, greedy[:2], [None] * 2, shared)
    assert chosen == pytest.approx([math.log(0.25)] * 2)
