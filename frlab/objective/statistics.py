"""`TokenBatch`: one (micro-)batch in the working dtype plus the statistics components share.

The objective builds a `TokenBatch` after the token filter has chosen `keep` and hands it to
the trust region. Shared statistics are computed on first use and then reused, so the
sequence KL that a gate reads and the one the objective logs are one computation:

- `log_ratio`   log rho = log_probs.detach() - behaviour on policy tokens, exactly 0 elsewhere;
- `ratio`       rho = exp(log rho) on KEPT tokens, exactly 1 elsewhere: a token dropped by the
                token filter (or masked) is never exponentiated, so its ratio cannot overflow;
- `token_kl`    d_t = KL(Bern(p) || Bern(q)), p = exp(behaviour), q = exp(current), both clamped
                to [1e-6, 1 - 1e-6], 0 off the policy tokens (the divergence of behaviour from
                current; the direction matters);
- `sequence_kl` max(0, sum_t d_t / T_i) over the ORIGINAL T_i policy tokens (the statistic
                of the FlashREINFORCE paper's Sequence Trust Region).

Masked slots are replaced with `torch.where` before any arithmetic, so NaN/inf there never
reach a statistic.
"""

from __future__ import annotations

import math
from functools import cached_property

import torch
from torch import Tensor

PROB_EPS = 1e-6  # p and q of the Bernoulli KL are clamped to [1e-6, 1 - 1e-6]
_LOG_LO, _LOG_HI = math.log(PROB_EPS), math.log1p(-PROB_EPS)


def count_per_row(mask: Tensor) -> Tensor:
    """Number of True entries per row [B] (int64) of a bool [B,T] mask.

    Summed as bytes into int32 (exact for T < 2**31): a plain bool `.sum` first converts the
    whole mask to int64, which costs a full extra pass on CPU.
    """
    return mask.view(torch.uint8).sum(dim=1, dtype=torch.int32).long()


def log_ratio(log_probs: Tensor, behavior_log_probs: Tensor, action_mask: Tensor) -> Tensor:
    """log rho = current.detach() - behaviour on policy tokens, exactly 0 elsewhere."""
    diff = log_probs.detach() - behavior_log_probs.detach()
    return torch.where(action_mask, diff, 0.0)


def _bernoulli_terms(log_x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(x, 1 - x, log x, log(1 - x)) for x = exp(log_x) clamped to [eps, 1 - eps].

    Clamping log x at log(eps), log(1 - eps) is the same clamp on x and gives log x without
    a `log(exp(.))` round trip. 1 - x is formed as `1 - exp(log x)`, as the reference does:
    in float32 it carries the rounding of x near 1 (a sequence-KL error of ~1e-6 at most
    here, far below any useful delta); `-expm1(log x)` would be exact but costs more.
    """
    log_x = log_x.clamp(_LOG_LO, _LOG_HI)
    x = log_x.exp()
    one_minus = torch.sub(1.0, x)
    return x, one_minus, log_x, one_minus.log()


def bernoulli_token_kl(
    log_probs: Tensor, behavior_log_probs: Tensor, action_mask: Tensor
) -> Tensor:
    """d_t = p (log p - log q) + (1 - p)(log(1 - p) - log(1 - q)), 0 on masked tokens."""
    p, one_minus_p, log_p, log_1mp = _bernoulli_terms(behavior_log_probs.detach())
    _, _, log_q, log_1mq = _bernoulli_terms(log_probs.detach())
    d = log_p.sub_(log_q).mul_(p)
    d.addcmul_(log_1mp.sub_(log_1mq), one_minus_p)
    return torch.where(action_mask, d, 0.0)


def sequence_mean(token_values: Tensor, action_mask: Tensor) -> Tensor:
    """sum_t value / T_i over the ORIGINAL policy tokens (values already 0 off-mask)."""
    return token_values.sum(dim=1) / count_per_row(action_mask)


class TokenBatch:
    """The tensors of one objective call and their shared statistics (computed once, lazily).

    `log_probs [B,T]` (working dtype, carries the gradient), `behavior_log_probs [B,T]`
    (detached), `advantages [B]` (detached), `action_mask [B,T]` bool, `keep [B,T]` bool (the
    token filter's choice, a subset of the mask; the mask itself when nothing is filtered).
    """

    def __init__(
        self,
        log_probs: Tensor,
        behavior_log_probs: Tensor,
        advantages: Tensor,
        action_mask: Tensor,
        keep: Tensor | None = None,
    ) -> None:
        self.log_probs = log_probs
        self.behavior_log_probs = behavior_log_probs.detach()
        self.advantages = advantages.detach()
        self.action_mask = action_mask
        self.keep = action_mask if keep is None else keep

    @property
    def dtype(self) -> torch.dtype:
        return self.log_probs.dtype

    @cached_property
    def policy_tokens(self) -> Tensor:
        """T_i [B] (int64): policy tokens per row, whatever the filter or gate removes."""
        return count_per_row(self.action_mask)

    @cached_property
    def log_ratio(self) -> Tensor:
        """log rho on policy tokens, exactly 0 elsewhere."""
        return log_ratio(self.log_probs, self.behavior_log_probs, self.action_mask)

    @cached_property
    def ratio(self) -> Tensor:
        """rho on kept tokens, exactly 1 elsewhere (filtered tokens are never exponentiated)."""
        if "log_ratio" not in self.__dict__:  # one pass: log-ratio on kept tokens, exp in place
            return log_ratio(self.log_probs, self.behavior_log_probs, self.keep).exp_()
        if self.keep is not self.action_mask:
            return torch.where(self.keep, self.log_ratio, 0.0).exp_()
        return self.log_ratio.exp()  # the cached log-ratio may still be in use: not in place

    @cached_property
    def token_kl(self) -> Tensor:
        """Per-token Bernoulli KL of behaviour from current [B,T], 0 off the policy tokens."""
        return bernoulli_token_kl(self.log_probs, self.behavior_log_probs, self.action_mask)

    @cached_property
    def sequence_kl(self) -> Tensor:
        """max(0, sum_t d_t / T_i) [B]: the FlashREINFORCE sequence trust-region statistic."""
        return (self.token_kl.sum(dim=1) / self.policy_tokens).clamp_min_(0.0)

    def all_rows(self) -> Tensor:
        """admitted [B] with every row True."""
        return torch.ones(self.action_mask.shape[0], dtype=torch.bool, device=self.device)

    @property
    def device(self) -> torch.device:
        return self.action_mask.device

    def sequence_mean(self, token_values: Tensor) -> Tensor:
        """[B]: sum_t value / T_i (values must already be 0 off the policy tokens)."""
        return token_values.sum(dim=1) / self.policy_tokens

    def token_fraction(self, flags: Tensor) -> Tensor:
        """0-d: the fraction of this call's policy tokens where `flags` is True (working dtype)."""
        hits = (flags & self.action_mask).sum()
        return hits.to(self.dtype) / self.policy_tokens.sum().to(self.dtype)
