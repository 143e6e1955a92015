"""`flashreinforce_loss`: the reference-compatible loss of the FlashREINFORCE paper.

Drop-in for the public reference function (users migrate with one import change): same
arguments, semantics, validation, dtype promotion, NaN-safe masking and diagnostics keys
(`advantages`, `sequence_kl`, `admitted`, `acceptance_rate`, `policy_tokens`,
`retained_tokens`). It is the `flashreinforce` preset of `Objective` (batch_mean +
sequence_bernoulli_kl + sample_mean), with the `entropy_failures` token filter switched on only
when `negative_token_fraction < 1`. The rows given ARE the learner batch: advantages are
centred over them, and the normalisers are their B and T_i.

Edge cases as the reference: the working dtype is keyed on `log_probs` alone (float64 stays
float64, anything else runs in float32, so fp32 log-probs with fp64 rewards give an fp32
loss); entropies are ranked in their own dtype; `acceptance_rate` is float32; `delta` may be a
Python number or a 0-d tensor; a token the entropy filter drops is never exponentiated, so a
huge log-ratio there cannot overflow.
"""

from __future__ import annotations

from functools import lru_cache

from torch import Tensor

from frlab.objective.objective import Objective
from frlab.objective.token_filters import EntropyFailures
from frlab.objective.trust_regions import SequenceBernoulliKL

_DELTA = SequenceBernoulliKL.spec("delta")  # one declaration of each range, the components'
_Q = EntropyFailures.spec("q")


@lru_cache(maxsize=64)
def _objective(delta: float, q: float) -> Objective:
    """The composed objective for (delta, q); components are stateless, so it is shared."""
    if q < 1.0:
        return Objective(
            token_filter="entropy_failures",
            params={"sequence_bernoulli_kl": {"delta": delta}, "entropy_failures": {"q": q}},
        )
    return Objective(params={"sequence_bernoulli_kl": {"delta": delta}})


def flashreinforce_loss(
    log_probs: Tensor,
    behavior_log_probs: Tensor,
    rewards: Tensor,
    action_mask: Tensor,
    *,
    delta: float | Tensor = 3e-3,
    negative_token_fraction: float = 1.0,
    entropies: Tensor | None = None,
    failures: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """loss = -(1/B) sum_i (1/T_i) sum_{t kept, i admitted} rho_{i,t} A_i log_probs_{i,t}.

    A_i = R_i - mean R; rho = exp(log_probs.detach() - behavior_log_probs); row i is admitted
    iff its mean Bernoulli KL of behaviour from current is <= `delta`; with
    `negative_token_fraction` q < 1, rows flagged by `failures` keep only their ceil(q T_i)
    highest-`entropies` policy tokens. Returns (loss, diagnostics).
    """
    delta = _DELTA.check(delta, "delta")
    q = _Q.check(negative_token_fraction, "negative_token_fraction")
    if q < 1.0 and (entropies is None or failures is None):
        raise ValueError(
            f"negative_token_fraction={q} < 1 filters tokens, which needs entropies [B, T] and "
            f"failures [B]; got entropies={'None' if entropies is None else 'tensor'}, "
            f"failures={'None' if failures is None else 'tensor'}"
        )
    return _objective(delta, q).loss_from_rewards(
        log_probs, behavior_log_probs, rewards, action_mask, entropies=entropies, failures=failures
    )
