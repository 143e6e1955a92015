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

BLOCK = 256  # tokens per block of the two-level inverse-CDF search


def sampling_log_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Log-probs [b,V] of the distributions sampled from: logits / T, then top-k/top-p,
    renormalised."""
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32)
    scaled = logits.float() / temperature.to(logits.device).unsqueeze(1)  # a new tensor
    top_k = [p.top_k if 0 < p.top_k < scaled.shape[1] else 0 for p in params]
    if any(top_k):
        _mask_top_k(scaled, top_k)
    for row, p in enumerate(params):
        if p.top_p < 1.0:
            scaled[row] = truncate(scaled[row], 0, p.top_p)
    return torch.log_softmax(scaled, dim=-1)


def _mask_top_k(scaled: torch.Tensor, top_k: list[int]) -> None:
    """In place: -inf below each row's k-th largest value (rows with k = 0 untouched; ties
    with the k-th value are kept), one reduction for all truncated rows."""
    rows = [i for i, k in enumerate(top_k) if k]
    every = len(rows) == scaled.shape[0]
    index = None if every else torch.tensor(rows, device=scaled.device)
    sub = scaled if index is None else scaled[index]
    if max(top_k) == 1:  # greedy: the k-th largest is the maximum
        kth = sub.amax(dim=-1, keepdim=True)
    else:
        ks = torch.tensor([top_k[i] - 1 for i in rows], device=scaled.device).unsqueeze(1)
        kth = torch.topk(sub, max(top_k), dim=-1).values.gather(1, ks)
    if index is None:
        scaled.masked_fill_(scaled < kth, float("-inf"))
    else:
        scaled[index] = sub.masked_fill(sub < kth, float("-inf"))


def truncate(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """One row: mask (to -inf) tokens outside the top-k and outside the smallest top-p nucleus."""
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


def draw(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    shared: torch.Generator,
) -> tuple[torch.Tensor, list[float]]:
    """Sample one token per row [b] and its log-prob under the row's sampling distribution.

    Every row consumes one uniform draw. When every row is greedy (top_k=1, no top-p) and its
    maximum is unique, the distribution is a point mass: the token is the argmax and its
    log-prob exactly 0.0, as the general path gives, without full-vocabulary work."""
    u = uniforms(generators, shared)
    if all(p.top_k == 1 and p.top_p >= 1.0 for p in params):
        temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32)
        scaled = logits.float() / temperature.to(logits.device).unsqueeze(1)
        best = scaled.amax(dim=-1, keepdim=True)
        if bool(((scaled == best).sum(dim=-1) == 1).all()):
            return scaled.argmax(dim=-1), [0.0] * len(params)
    log_probs = sampling_log_probs(logits, params)
    tokens = inverse_cdf(log_probs, u)
    return tokens, log_probs.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()


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
    rounding), using the uniform `u[i]`; never a token of probability 0.

    Two levels, so no float64 cumulative sum over the whole vocabulary: float64 sums of blocks
    of BLOCK tokens pick the block, then a float64 cumulative sum inside that block picks the
    token. A row whose two levels disagree by rounding falls back to the one-level search."""
    probs = log_probs.exp()
    rows, vocab = probs.shape
    nblocks = -(-vocab // BLOCK)
    padded = torch.nn.functional.pad(probs, (0, nblocks * BLOCK - vocab)).view(rows, nblocks, BLOCK)
    block_cdf = padded.sum(dim=-1, dtype=torch.float64).cumsum(dim=-1)  # [b, nblocks]
    target = u.to(device=probs.device, dtype=torch.float64) * block_cdf[:, -1]
    block = torch.searchsorted(block_cdf, target.unsqueeze(1), right=True).squeeze(1)
    block = block.clamp_max(nblocks - 1)
    before = torch.where(
        block > 0, block_cdf.gather(1, (block - 1).clamp_min(0).unsqueeze(1)).squeeze(1), 0.0
    )
    arange = torch.arange(rows, device=probs.device)
    inner = padded[arange, block].double().cumsum(dim=-1) + before.unsqueeze(1)
    pos = torch.searchsorted(inner, target.unsqueeze(1), right=True).squeeze(1)
    tokens = block * BLOCK + pos.clamp_max(BLOCK - 1)
    bad = (pos >= BLOCK) | (tokens >= vocab)
    if bool(bad.any()):
        rows_bad = bad.nonzero().squeeze(1)
        tokens[rows_bad] = _inverse_cdf_flat(probs[rows_bad], u.to(probs.device)[rows_bad])
    return tokens


def _inverse_cdf_flat(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The one-level search: a float64 cumulative sum over the whole vocabulary."""
    cdf = torch.cumsum(probs.double(), dim=-1)
    target = u.to(dtype=torch.float64) * cdf[:, -1]
    tokens = torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(1)
    over = tokens >= cdf.shape[1]  # u * total rounded up to total: take the last likely token
    if bool(over.any()):
        last = cdf.shape[1] - 1 - torch.flip(probs > 0, dims=[1]).int().argmax(dim=1)
        tokens = torch.where(over, last, tokens)
    return tokens
