"""How the torch engine samples: the distribution it draws from, and the random draw itself.

The distribution of one row is `log_softmax(logits / temperature)`, then top-k / top-p
truncation if set (tokens outside are -inf) and renormalised; that row of log-probs is what the
engine records for the token it draws (FlashREINFORCE, paper Sec. 3: store the sampler's real
probability). The draw is an inverse-CDF lookup with ONE uniform number per row: the row's own
`torch.Generator` when the request carries a seed (so the draw does not depend on which other
requests share the batch, or in which order), else the engine's shared generator.
"""

from __future__ import annotations

import torch

from frlab.rollout.engine import SamplingParams


def sampling_log_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Log-probs [b,V] of the distributions sampled from: logits / T, then top-k/top-p, renormalised."""
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32)
    scaled = logits.float() / temperature.to(logits.device).unsqueeze(1)
    for row, p in enumerate(params):
        if p.top_k > 0 or p.top_p < 1.0:
            scaled[row] = truncate(scaled[row], p.top_k, p.top_p)
    return torch.log_softmax(scaled, dim=-1)


def truncate(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) tokens outside the top-k and outside the smallest top-p nucleus."""
    keep = torch.ones_like(scaled, dtype=torch.bool)
    if top_k > 0 and top_k < scaled.numel():
        kth = torch.topk(scaled, top_k).values[-1]
        keep &= scaled >= kth
    if top_p < 1.0:
        order = torch.argsort(scaled, descending=True)
        probs = torch.softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1)[order]
        mass_before = torch.cumsum(probs, dim=0) - probs
        nucleus = torch.zeros_like(keep)
        nucleus[order] = mass_before < top_p
        keep &= nucleus
    return scaled.masked_fill(~keep, float("-inf"))


def request_generator(seed: int | None) -> torch.Generator | None:
    """A CPU generator seeded with `seed` (None when the request has no seed of its own)."""
    return None if seed is None else torch.Generator().manual_seed(int(seed))


def uniforms(generators: list[torch.Generator | None], shared: torch.Generator) -> torch.Tensor:
    """One float64 U[0,1) draw per row [b] (CPU): from the row's generator, else `shared`."""
    if all(g is None for g in generators):
        return torch.rand(len(generators), generator=shared, dtype=torch.float64)
    return torch.cat(
        [torch.rand(1, generator=g or shared, dtype=torch.float64) for g in generators]
    )


def inverse_cdf(log_probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token ids [b]: row i draws token t with probability exp(log_probs[i, t]) (up to float64
    rounding of the cumulative sum), using the uniform `u[i]`; never a token of probability 0."""
    probs = log_probs.exp().double()
    cdf = torch.cumsum(probs, dim=-1)
    target = u.to(device=cdf.device, dtype=torch.float64) * cdf[:, -1]
    tokens = torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(1)
    over = tokens >= cdf.shape[1]  # u * total rounded up to total: take the last likely token
    if bool(over.any()):
        positive = probs > 0
        last = cdf.shape[1] - 1 - torch.flip(positive, dims=[1]).int().argmax(dim=1)
        tokens = torch.where(over, last, tokens)
    return tokens
