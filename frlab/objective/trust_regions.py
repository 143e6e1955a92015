"""Trust regions and off-policy corrections: per-token weights, admission gate, diagnostics.

Every component maps a `TokenBatch` to a `TrustRegionOutput`: detached `weights` (0 on masked,
filtered and rejected tokens), `admitted [B]` and its declared diagnostics. The objective's
per-token term is `-weights * A_i * log_probs`. With `rho = exp(current.detach() - behavior)`
on kept policy tokens (no clipping):

- `sequence_bernoulli_kl` (the FlashREINFORCE paper's Sequence Trust Region): admit row i iff the
  mean per-token Bernoulli KL of behaviour from current, over its
  T_i policy tokens, is <= delta (inclusive; delta = inf admits all); weights = rho.
- `none`: plain token importance sampling, every row admitted (the paper's PG-IS ablation).
- `no_is`: ratio against the detached current policy, i.e. weight 1 on every kept policy
  token, no gate (the paper's no_is ablation).
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

Gate statistics (sequence KL, k3, geometric ratio) look at every policy token; weights are
formed on kept tokens only, so a token the token filter dropped is never exponentiated. A
weight that overflows (rho = inf) on an admitted token raises `FloatingPointError` instead of
poisoning the gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from frlab.objective.base import (
    TRUST_REGIONS,
    Diagnostic,
    TokenBatch,
    TrustRegion,
    TrustRegionOutput,
    hyperparameter,
)


def _delta(doc: str) -> float:
    return hyperparameter(3e-3, low=0.0, doc=doc)


@TRUST_REGIONS.register("sequence_bernoulli_kl")
@dataclass(frozen=True)
class SequenceBernoulliKL(TrustRegion):
    """Token IS ratio; admit a trajectory iff its mean Bernoulli KL <= `delta`."""

    source = "FlashREINFORCE (Sequence Trust Region)"
    delta: float = _delta("largest mean Bernoulli KL admitted (inclusive; .inf admits all)")

    def __call__(self, batch: TokenBatch) -> TrustRegionOutput:
        return self.admit_rows(batch, batch.sequence_kl <= self.delta)


@TRUST_REGIONS.register("none")
@dataclass(frozen=True)
class TokenIS(TrustRegion):
    """Plain token IS ratio, no gate."""

    source = "FlashREINFORCE PG-IS ablation"
    admits_all = True

    def __call__(self, batch: TokenBatch) -> TrustRegionOutput:
        return self.admit_rows(batch, batch.all_rows())


@TRUST_REGIONS.register("no_is")
@dataclass(frozen=True)
class NoIS(TrustRegion):
    """Ratio against the detached current policy (weight 1), no gate."""

    source = "FlashREINFORCE no_is ablation"
    admits_all = True
    off_policy_correction = False

    def __call__(self, batch: TokenBatch) -> TrustRegionOutput:
        return self.weigh_rows(batch, batch.keep.to(batch.dtype))


@TRUST_REGIONS.register("token_bernoulli_kl")
@dataclass(frozen=True)
class TokenBernoulliKL(TrustRegion):
    """The same KL as a per-token mask `d_t <= delta`; a row is admitted if any token is."""

    source = "token-level variant of the above"
    delta: float = _delta("largest per-token Bernoulli KL admitted (inclusive)")
    diagnostics = (
        Diagnostic("token_acceptance_rate", "admitted policy tokens / policy tokens", "token"),
    )

    def __call__(self, batch: TokenBatch) -> TrustRegionOutput:
        ok = batch.token_kl <= self.delta
        return self.admit_tokens(batch, ok, token_acceptance_rate=batch.token_fraction(ok))


@TRUST_REGIONS.register("sequence_k3")
@dataclass(frozen=True)
class SequenceK3(TrustRegion):
    """Gate on the sequence-mean k3 KL estimate `mean_t (rho - 1 - log rho) <= delta`."""

    source = "k3 estimator (Schulman, 2020)"
    delta: float = _delta("largest sequence-mean k3 admitted (inclusive)")
    diagnostics = (Diagnostic("sequence_k3", "mean_t (rho - 1 - log rho) per trajectory"),)

    def __call__(self, batch: TokenBatch) -> TrustRegionOutput:
        lr = batch.log_ratio
        k3 = batch.sequence_mean(lr.exp().sub_(1.0).sub_(lr))  # 0 on masked slots (rho = 1)
        return self.admit_rows(batch, k3 <= self.delta, sequence_k3=k3)


@TRUST_REGIONS.register("geometric_ratio")
@dataclass(frozen=True)
class GeometricRatio(TrustRegion):
    """Gate on the geometric-mean ratio `exp(mean_t log rho)` in `[lower, upper]`."""

    source = "GSPO-style sequence masking (Zheng et al., 2025)"
    lower: float = hyperparameter(0.999, low=0.0, doc="smallest geometric-mean ratio admitted")
    upper: float = hyperparameter(1.001, low=0.0, doc="largest geometric-mean ratio admitted")
    diagnostics = (Diagnostic("geometric_ratio", "exp(mean_t log rho) per trajectory"),)

    def check(self) -> None:
        if self.lower > self.upper:
            raise ValueError(
                f"geometric_ratio needs lower <= upper, got lower={self.lower}, upper={self.upper}"
            )

    def __call__(self, batch: TokenBatch) -> TrustRegionOutput:
        ratio = batch.sequence_mean(batch.log_ratio).exp()
        admitted = (ratio >= self.lower) & (ratio <= self.upper)
        return self.admit_rows(batch, admitted, geometric_ratio=ratio)


@TRUST_REGIONS.register("token_tis")
@dataclass(frozen=True)
class TruncatedIS(TrustRegion):
    """Truncated token IS, `min(rho, cap)`."""

    source = "TIS (Yao et al., 2025)"
    admits_all = True
    cap: float = hyperparameter(2.0, low=0.0, low_open=True, finite=True, doc="largest weight")
    diagnostics = (
        Diagnostic("truncated_fraction", "policy tokens with rho > cap / policy tokens", "token"),
    )

    def __call__(self, batch: TokenBatch) -> TrustRegionOutput:
        rho = batch.ratio
        truncated = (rho > self.cap) & batch.keep
        return self.weigh_rows(
            batch, rho.clamp_max(self.cap), truncated_fraction=batch.token_fraction(truncated)
        )


@TRUST_REGIONS.register("ppo_clip")
@dataclass(frozen=True)
class PPOClip(TrustRegion):
    """PPO clipped surrogate (`eps_low`, `eps_high`), gradient-equivalent form."""

    source = "PPO (Schulman et al., 2017) / GRPO"
    admits_all = True
    eps_low: float = hyperparameter(0.2, low=0.0, high=1.0, doc="clip below 1 - eps_low (A < 0)")
    eps_high: float = hyperparameter(0.2, low=0.0, doc="clip above 1 + eps_high (A > 0)")
    diagnostics = (
        Diagnostic(
            "clip_fraction", "policy tokens whose ratio is clipped / policy tokens", "token"
        ),
    )

    def __call__(self, batch: TokenBatch) -> TrustRegionOutput:
        rho, a = batch.ratio, batch.advantages.unsqueeze(1)
        clipped = ((a > 0) & (rho > 1.0 + self.eps_high)) | ((a < 0) & (rho < 1.0 - self.eps_low))
        clipped &= batch.keep
        weights = torch.where(clipped, 0.0, rho)
        return self.weigh_rows(batch, weights, clip_fraction=batch.token_fraction(clipped))
