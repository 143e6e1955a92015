"""Trust regions and off-policy corrections: per-token weights, admission mask, diagnostics.

Every component maps (log_probs, behavior_log_probs, advantages, action_mask) [B,T]/[B] to a
`TrustRegionOutput`: detached `weights` (0 on masked tokens and on rejected rows/tokens),
`admitted [B]` and diagnostics. The objective's per-token term is `-weights * A_i * log_probs`.
With `rho = exp(current.detach() - behavior)` on policy tokens (SPEC §2 rule 2):

- `sequence_bernoulli_kl` (FlashREINFORCE's Sequence Trust Region, SPEC §2 rule 3): admit row i
  iff the mean per-token Bernoulli KL of behaviour from current, over its T_i policy tokens,
  is <= delta; weights = rho, unclipped.
- `none`: plain token importance sampling, every row admitted (the paper's PG-IS ablation).
- `no_is`: ratio against the detached current policy, i.e. weight 1 on every policy token, no
  gate (the paper's no_is ablation).
- `token_bernoulli_kl`: the same per-token divergence as a per-token mask d_t <= delta.
- `sequence_k3`: gate on the sequence mean of k3 = rho - 1 - log rho, Schulman's low-variance
  estimator of KL(behaviour || current) from behaviour samples.
- `geometric_ratio`: admit iff lower <= exp(mean_t log rho) <= upper (geometric-mean ratio
  sequence mask, as in GSPO-style sequence-level corrections).
- `token_tis`: truncated importance sampling, weights = min(rho, cap).
- `ppo_clip`: PPO's clipped surrogate (Schulman et al. 2017) as used by GRPO, in its
  gradient-equivalent form: weights = rho except 0 where the clip is active (A > 0 and
  rho > 1 + eps_high, or A < 0 and rho < 1 - eps_low). The LOSS VALUE is therefore
  `-sum rho A log pi` over unclipped tokens, not `-min(rho A, clip(rho) A)`; the gradient is
  identical.

Every component reports `sequence_kl [B]` (the Bernoulli sequence KL, always computed so that
`train/sequence_kl_mean` exists whatever is chosen). A weight that overflows (rho = inf) on an
admitted policy token raises `FloatingPointError` instead of poisoning the gradient. Masked
slots are replaced with `torch.where`, so NaN/inf there never reaches weights or statistics.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from frlab.objective.base import TRUST_REGIONS, TrustRegionOutput, count_per_row
from frlab.objective.validation import check_delta, check_fraction, check_positive, real_param

PROB_EPS = 1e-6  # SPEC §2 rule 3: p and q are clamped to [1e-6, 1 - 1e-6]
_LOG_LO, _LOG_HI = math.log(PROB_EPS), math.log1p(-PROB_EPS)


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
    """d_t = KL(Bern(p) || Bern(q)), p = exp(behaviour), q = exp(current); 0 on masked tokens.

    d = p (log p - log q) + (1 - p)(log(1 - p) - log(1 - q)) with p, q in [1e-6, 1 - 1e-6]
    (SPEC §2 rule 3: the divergence of behaviour from current; the direction matters).
    """
    p, one_minus_p, log_p, log_1mp = _bernoulli_terms(behavior_log_probs.detach())
    _, _, log_q, log_1mq = _bernoulli_terms(log_probs.detach())
    d = log_p.sub_(log_q).mul_(p)
    d.addcmul_(log_1mp.sub_(log_1mq), one_minus_p)
    return torch.where(action_mask, d, 0.0)


def sequence_mean(token_values: Tensor, action_mask: Tensor) -> Tensor:
    """sum_t value / T_i over the ORIGINAL policy tokens (values already 0 off-mask)."""
    return token_values.sum(dim=1) / count_per_row(action_mask)


def bernoulli_sequence_kl(
    log_probs: Tensor, behavior_log_probs: Tensor, action_mask: Tensor
) -> Tensor:
    """sequence_kl_i = max(0, sum_t d_t / T_i) (SPEC §2 rule 3)."""
    d = bernoulli_token_kl(log_probs, behavior_log_probs, action_mask)
    return sequence_mean(d, action_mask).clamp_min_(0.0)


def check_finite_weights(weights: Tensor, who: str) -> Tensor:
    """Raise FloatingPointError if an admitted policy token's weight overflowed (one sync)."""
    if math.isfinite(weights.amax().item()):
        return weights
    rows = (~torch.isfinite(weights)).any(dim=1).nonzero().flatten().tolist()
    raise FloatingPointError(
        f"trust region {who!r}: importance ratio rho = exp(current - behaviour) is not finite on "
        f"an admitted policy token in row(s) {rows[:10]}; the behaviour log-probs are far below "
        "the current ones (stale or wrong behaviour log-probs?)"
    )


def _rows_all(action_mask: Tensor) -> Tensor:
    return torch.ones(action_mask.shape[0], dtype=torch.bool, device=action_mask.device)


def _gated(rho: Tensor, admitted: Tensor, action_mask: Tensor, who: str) -> Tensor:
    weights = torch.where(action_mask & admitted.unsqueeze(1), rho, 0.0)
    return check_finite_weights(weights, who)


class _Base:
    """Shared plumbing: rho and the Bernoulli sequence KL diagnostic."""

    off_policy_correction = True

    def _prepare(
        self, log_probs: Tensor, behavior_log_probs: Tensor, action_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        lr = log_ratio(log_probs, behavior_log_probs, action_mask)
        kl = bernoulli_sequence_kl(log_probs, behavior_log_probs, action_mask)
        return lr, kl


@TRUST_REGIONS.register("sequence_bernoulli_kl")
class SequenceBernoulliKL(_Base):
    """Admit row i iff sequence_kl_i <= delta (inclusive); weights = rho (FlashREINFORCE)."""

    def __init__(self, delta: float = 3e-3) -> None:
        self.delta = check_delta(delta, "sequence_bernoulli_kl.delta")

    def __call__(
        self, log_probs: Tensor, behavior_log_probs: Tensor, advantages: Tensor, action_mask: Tensor
    ) -> TrustRegionOutput:
        lr, kl = self._prepare(log_probs, behavior_log_probs, action_mask)
        admitted = kl <= self.delta
        weights = _gated(lr.exp_(), admitted, action_mask, "sequence_bernoulli_kl")
        return TrustRegionOutput(weights, admitted, {"sequence_kl": kl})


@TRUST_REGIONS.register("none")
class TokenIS(_Base):
    """Plain token importance sampling: weights = rho, every row admitted (PG-IS ablation)."""

    def __call__(
        self, log_probs: Tensor, behavior_log_probs: Tensor, advantages: Tensor, action_mask: Tensor
    ) -> TrustRegionOutput:
        lr, kl = self._prepare(log_probs, behavior_log_probs, action_mask)
        admitted = _rows_all(action_mask)
        weights = _gated(lr.exp_(), admitted, action_mask, "none")
        return TrustRegionOutput(weights, admitted, {"sequence_kl": kl})


@TRUST_REGIONS.register("no_is")
class NoIS(_Base):
    """Ratio against the detached current policy: weight 1 on policy tokens, no gate."""

    off_policy_correction = False

    def __call__(
        self, log_probs: Tensor, behavior_log_probs: Tensor, advantages: Tensor, action_mask: Tensor
    ) -> TrustRegionOutput:
        kl = bernoulli_sequence_kl(log_probs, behavior_log_probs, action_mask)
        weights = action_mask.to(log_probs.dtype)
        return TrustRegionOutput(weights, _rows_all(action_mask), {"sequence_kl": kl})


@TRUST_REGIONS.register("token_bernoulli_kl")
class TokenBernoulliKL(_Base):
    """Per-token gate d_t <= delta; weights = rho on admitted tokens.

    `admitted_i` = row i keeps at least one token; `token_acceptance_rate` = admitted policy
    tokens / policy tokens.
    """

    def __init__(self, delta: float = 3e-3) -> None:
        self.delta = check_delta(delta, "token_bernoulli_kl.delta")

    def __call__(
        self, log_probs: Tensor, behavior_log_probs: Tensor, advantages: Tensor, action_mask: Tensor
    ) -> TrustRegionOutput:
        lr = log_ratio(log_probs, behavior_log_probs, action_mask)
        d = bernoulli_token_kl(log_probs, behavior_log_probs, action_mask)
        kl = sequence_mean(d, action_mask).clamp_min_(0.0)
        token_ok = action_mask & (d <= self.delta)
        weights = check_finite_weights(torch.where(token_ok, lr.exp_(), 0.0), "token_bernoulli_kl")
        rate = token_ok.sum() / action_mask.sum()
        diag = {"sequence_kl": kl, "token_acceptance_rate": rate.to(log_probs.dtype)}
        return TrustRegionOutput(weights, token_ok.any(dim=1), diag, token_admitted=token_ok)


@TRUST_REGIONS.register("sequence_k3")
class SequenceK3(_Base):
    """Admit iff mean_t (rho - 1 - log rho) <= delta (k3 estimate of KL(behaviour||current))."""

    def __init__(self, delta: float = 3e-3) -> None:
        self.delta = check_delta(delta, "sequence_k3.delta")

    def __call__(
        self, log_probs: Tensor, behavior_log_probs: Tensor, advantages: Tensor, action_mask: Tensor
    ) -> TrustRegionOutput:
        lr, kl = self._prepare(log_probs, behavior_log_probs, action_mask)
        rho = lr.exp()
        k3 = sequence_mean((rho - 1.0).sub_(lr), action_mask)  # 0 on masked slots (rho = 1)
        admitted = k3 <= self.delta
        weights = _gated(rho, admitted, action_mask, "sequence_k3")
        return TrustRegionOutput(weights, admitted, {"sequence_kl": kl, "sequence_k3": k3})


@TRUST_REGIONS.register("geometric_ratio")
class GeometricRatio(_Base):
    """Admit iff lower <= exp(mean_t log rho) <= upper; weights = rho."""

    def __init__(self, lower: float = 0.999, upper: float = 1.001) -> None:
        self.lower = real_param(lower, "geometric_ratio.lower")
        self.upper = real_param(upper, "geometric_ratio.upper")
        if not 0.0 <= self.lower <= self.upper:
            raise ValueError(
                f"geometric_ratio needs 0 <= lower <= upper, got lower={self.lower}, upper={self.upper}"
            )

    def __call__(
        self, log_probs: Tensor, behavior_log_probs: Tensor, advantages: Tensor, action_mask: Tensor
    ) -> TrustRegionOutput:
        lr, kl = self._prepare(log_probs, behavior_log_probs, action_mask)
        ratio = sequence_mean(lr, action_mask).exp()
        admitted = (ratio >= self.lower) & (ratio <= self.upper)
        weights = _gated(lr.exp_(), admitted, action_mask, "geometric_ratio")
        return TrustRegionOutput(weights, admitted, {"sequence_kl": kl, "geometric_ratio": ratio})


@TRUST_REGIONS.register("token_tis")
class TruncatedIS(_Base):
    """Truncated token IS: weights = min(rho, cap), every row admitted."""

    def __init__(self, cap: float = 2.0) -> None:
        self.cap = check_positive(cap, "token_tis.cap")

    def __call__(
        self, log_probs: Tensor, behavior_log_probs: Tensor, advantages: Tensor, action_mask: Tensor
    ) -> TrustRegionOutput:
        lr, kl = self._prepare(log_probs, behavior_log_probs, action_mask)
        rho = lr.exp_()
        truncated = (rho > self.cap) & action_mask
        weights = torch.where(action_mask, rho.clamp_max(self.cap), 0.0)
        frac = (truncated.sum() / action_mask.sum()).to(log_probs.dtype)
        diag = {"sequence_kl": kl, "truncated_fraction": frac}
        return TrustRegionOutput(weights, _rows_all(action_mask), diag)


@TRUST_REGIONS.register("ppo_clip")
class PPOClip(_Base):
    """Gradient-equivalent PPO clip: rho, but 0 where min(rho A, clip(rho) A) is the clip."""

    def __init__(self, eps_low: float = 0.2, eps_high: float = 0.2) -> None:
        self.eps_low = check_fraction(eps_low, "ppo_clip.eps_low")
        self.eps_high = real_param(eps_high, "ppo_clip.eps_high")
        if self.eps_high < 0:
            raise ValueError(f"ppo_clip.eps_high must be >= 0, got {self.eps_high}")

    def __call__(
        self, log_probs: Tensor, behavior_log_probs: Tensor, advantages: Tensor, action_mask: Tensor
    ) -> TrustRegionOutput:
        lr, kl = self._prepare(log_probs, behavior_log_probs, action_mask)
        rho = lr.exp_()
        a = advantages.detach().unsqueeze(1)
        clipped = ((a > 0) & (rho > 1.0 + self.eps_high)) | ((a < 0) & (rho < 1.0 - self.eps_low))
        clipped &= action_mask
        weights = check_finite_weights(torch.where(action_mask & ~clipped, rho, 0.0), "ppo_clip")
        frac = (clipped.sum() / action_mask.sum()).to(log_probs.dtype)
        diag = {"sequence_kl": kl, "clip_fraction": frac}
        return TrustRegionOutput(weights, _rows_all(action_mask), diag)
