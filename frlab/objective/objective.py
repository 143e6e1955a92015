"""`Objective`: one baseline, trust region, aggregation and token filter, composed by name.

The loss of the FlashREINFORCE paper is the `flashreinforce` preset:
    A_i = R_i - mean R,  rho = exp(log pi - log mu) on policy tokens,  admit row i iff its mean
    Bernoulli KL <= delta,  loss = -(1/B) sum_i (1/T_i) sum_t rho A_i log pi.
Every other preset swaps components: `pg_is` (no gate), `grpo`, `dr_grpo`, `rloo`.

Usage in a learner: `A = objective.advantages(rewards, prompt_ids)` ONCE on the full learner
batch, then for each micro-batch `loss, diag = objective(log_probs, behaviour, A[rows], mask,
num_sequences=B, num_tokens=global_policy_tokens)`; the micro-batch losses (and gradients) sum
to the full-batch ones.

One call: the token filter chooses `keep`, the objective builds a `TokenBatch` (shared
statistics: log-ratio, ratio on kept tokens, Bernoulli KL), the trust region weighs it, the
aggregation reduces `-weights * A_i * log_probs` over the kept tokens. The sequence KL that
`diagnostics["sequence_kl"]` reports is computed here, once, whatever the trust region.

Numerics: the working dtype is keyed on `log_probs` alone: float64 log-probs are computed in
float64, every other dtype (bf16, fp16, fp32) in float32, whatever the dtype of behaviour
log-probs, rewards or advantages (so fp32 log-probs with fp64 rewards give an fp32 loss).
Entropies are ranked in their own dtype. `acceptance_rate` is float32. Masked and filtered
slots are replaced with `torch.where` before any arithmetic, so NaN/inf there never reaches
the loss or the gradient, and a filtered token is never exponentiated; behaviour log-probs and
rewards get no gradient. Validation costs a few fused reductions and ONE host sync per call
(`validate=False` skips it); the trust region's overflow check of its weights costs one more.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from frlab.objective import aggregations as _aggregations  # noqa: F401  (registers components)
from frlab.objective import baselines as _baselines  # noqa: F401
from frlab.objective import token_filters as _token_filters  # noqa: F401
from frlab.objective import trust_regions as _trust_regions  # noqa: F401
from frlab.objective.base import (
    AGGREGATIONS,
    BASELINES,
    TOKEN_FILTERS,
    TRUST_REGIONS,
    Component,
    Diagnostic,
    TrustRegionOutput,
    compute_dtype,
)
from frlab.objective.hyperparameters import HyperparameterError
from frlab.objective.presets import DEFAULTS, PRESETS
from frlab.objective.statistics import TokenBatch, count_per_row
from frlab.objective.validation import (
    ValueChecks,
    check_loss_structure,
    check_rewards,
    check_row_tensor,
    check_token_tensors,
    check_trust_region_output,
)
from frlab.registry import Registry, RegistryError, unknown_name_message

KINDS: dict[str, Registry[type]] = {
    "baseline": BASELINES,
    "trust_region": TRUST_REGIONS,
    "aggregation": AGGREGATIONS,
    "token_filter": TOKEN_FILTERS,
}


def build_component(kind: str, name: object, params: Mapping[str, Any], key: str | None) -> Any:
    """Instantiate component `name` of `kind` with params[name] as its hyperparameters."""
    if not isinstance(name, str):
        raise HyperparameterError(key or kind, f"must be a component name (str), got {name!r}")
    cls: Any = KINDS[kind].get(name, key=key)
    kwargs = params.get(name)
    kwargs = {} if kwargs is None else kwargs
    where = f"{key.rsplit('.', 1)[0]}.{name}" if key and "." in key else name
    if not isinstance(kwargs, Mapping):
        raise HyperparameterError(
            where if key else f"params[{name!r}]",
            f"must be a mapping of keyword arguments, got {kwargs!r}",
        )
    allowed = tuple(h.name for h in cls.hyperparameters())
    for kw in kwargs:
        if kw not in allowed:
            raise HyperparameterError(
                f"{where}.{kw}",
                f"bad arguments for {kind} {name!r}: unknown hyperparameter {kw!r}"
                + ("" if allowed else " (it declares none)"),
                name=str(kw),
                choices=allowed,
            )
    return cls(**{str(k): v for k, v in kwargs.items()})


def component_names() -> set[str]:
    """Every registered component name, all kinds together."""
    return {n for registry in KINDS.values() for n in registry.names()}


class Objective:
    """A policy-gradient objective composed of one component of each kind, chosen by name.

    `params` holds per-component hyperparameters keyed by COMPONENT NAME (for example
    `{"sequence_bernoulli_kl": {"delta": 1e-3}}`); only the chosen components' entries are
    read, so switching a component never leaks another component's settings.
    """

    def __init__(
        self,
        baseline: str = "batch_mean",
        trust_region: str = "sequence_bernoulli_kl",
        aggregation: str = "sample_mean",
        token_filter: str = "none",
        params: Mapping[str, Mapping[str, Any]] | None = None,
        validate: bool = True,
        *,
        _key_prefix: str | None = None,
    ) -> None:
        params = {} if params is None else params
        if not isinstance(params, Mapping):
            raise ValueError(f"params must be a mapping keyed by component name, got {params!r}")
        chosen = {
            "baseline": baseline,
            "trust_region": trust_region,
            "aggregation": aggregation,
            "token_filter": token_filter,
        }
        built = {
            kind: build_component(
                kind, name, params, f"{_key_prefix}.{kind}" if _key_prefix else None
            )
            for kind, name in chosen.items()
        }
        self.baseline = built["baseline"]
        self.trust_region = built["trust_region"]
        self.aggregation = built["aggregation"]
        self.token_filter = built["token_filter"]
        self._names: dict[str, str] = dict(chosen)
        self.validate = bool(validate)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_config(cls, node: Mapping[str, Any], validate: bool = True) -> Objective:
        """From the `objective` config node: names under the kind keys, kwargs under names.

        A key that is neither a kind nor a registered component name raises (a misspelt
        kwargs key would otherwise be ignored silently), and so do the settings of a component
        that is not chosen. Errors name the config key (`objective.NAME.ARG`):
        `HyperparameterError` for a setting, `RegistryError` for an unknown component name.
        """
        if not isinstance(node, Mapping):
            raise ValueError(f"objective config must be a mapping, got {type(node).__name__}")
        known = component_names()
        for key in node:
            if key not in KINDS and key not in known:
                raise HyperparameterError(
                    f"objective.{key}",
                    "is neither a slot nor a component name",
                    name=str(key),
                    choices=tuple(sorted(set(KINDS) | known)),
                )
        names = {kind: node.get(kind, default) for kind, default in DEFAULTS.items()}
        params = {k: v for k, v in node.items() if k not in KINDS}
        for name in [n for n in params if n not in names.values()]:  # components not chosen
            for kind in (kind for kind, reg in KINDS.items() if name in reg):
                build_component(kind, name, params, f"objective.{kind}")
        return cls(**names, params=params, validate=validate, _key_prefix="objective")

    @classmethod
    def from_preset(
        cls, name: str, params: Mapping[str, Mapping[str, Any]] | None = None, validate: bool = True
    ) -> Objective:
        """A named preset (see `PRESETS`) with optional per-component kwargs."""
        if name not in PRESETS:
            raise RegistryError(unknown_name_message("objective preset", name, list(PRESETS)))
        return cls(**PRESETS[name], params=params, validate=validate)

    # ------------------------------------------------------------------ properties

    @property
    def names(self) -> dict[str, str]:
        """kind -> chosen component name."""
        return dict(self._names)

    @property
    def components(self) -> dict[str, Component]:
        """kind -> the built component."""
        return {kind: getattr(self, kind) for kind in KINDS}

    def component_params(self) -> dict[str, dict[str, Any]]:
        """component name -> its hyperparameter values, for the chosen components that have any."""
        return {c.name: c.params() for c in self.components.values() if c.hyperparameters()}

    @property
    def diagnostics(self) -> tuple[Diagnostic, ...]:
        """The chosen trust region's declared diagnostics (keys of the diagnostics dict)."""
        return tuple(self.trust_region.diagnostics)

    def diagnostic_metrics(self) -> dict[str, str]:
        """diagnostics key -> metric name (`train/<trust region>/<name>[_mean]`)."""
        return {d.name: d.metric(self._names["trust_region"]) for d in self.diagnostics}

    @property
    def needs_entropies(self) -> bool:
        """True when the token filter needs entropies [B,T] and failures [B]."""
        return bool(self.token_filter.needs_entropies)

    @property
    def is_group_baseline(self) -> bool:
        """True when the baseline needs > 1 sample per prompt (group ids)."""
        return bool(self.baseline.is_group)

    @property
    def uses_off_policy_correction(self) -> bool:
        """False only for `no_is` (no ratio against the behaviour policy)."""
        return bool(self.trust_region.off_policy_correction)

    @property
    def reports_acceptance(self) -> bool:
        """False when the trust region admits every trajectory by construction."""
        return not self.trust_region.admits_all

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._names.items())
        return f"Objective({inner})"

    # ------------------------------------------------------------------ maths

    def advantages(self, rewards: Tensor, group_ids: Tensor | None = None) -> Tensor:
        """Detached advantages [B]; call ONCE on the full learner batch, before any split."""
        if self.validate:
            check_rewards(rewards)
        return self.baseline(rewards.detach(), group_ids).detach()

    def __call__(
        self,
        log_probs: Tensor,
        behavior_log_probs: Tensor,
        advantages: Tensor,
        action_mask: Tensor,
        *,
        entropies: Tensor | None = None,
        failures: Tensor | None = None,
        num_sequences: int | None = None,
        num_tokens: int | Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """(loss, diagnostics) of one (micro-)batch; None normalisers mean 'this batch only'."""
        return self._loss(
            log_probs,
            behavior_log_probs,
            advantages,
            action_mask,
            entropies=entropies,
            failures=failures,
            num_sequences=num_sequences,
            num_tokens=num_tokens,
            rewards=None,
        )

    def loss_from_rewards(
        self,
        log_probs: Tensor,
        behavior_log_probs: Tensor,
        rewards: Tensor,
        action_mask: Tensor,
        *,
        group_ids: Tensor | None = None,
        entropies: Tensor | None = None,
        failures: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Advantages from `rewards` (this batch IS the learner batch), then the loss.

        Rewards are cast to the working dtype (keyed on `log_probs`) before the baseline and
        validated inside the same fused check as the token tensors (one sync).
        """
        if self.validate:
            check_token_tensors(log_probs, behavior_log_probs, action_mask)
            check_row_tensor(rewards, "rewards", log_probs, kind="real")
        rewards = rewards.detach().to(compute_dtype(log_probs))
        advantages = self.baseline(rewards, group_ids).detach()
        return self._loss(
            log_probs,
            behavior_log_probs,
            advantages,
            action_mask,
            entropies=entropies,
            failures=failures,
            num_sequences=None,
            num_tokens=None,
            rewards=rewards,
        )

    def _loss(
        self,
        log_probs: Tensor,
        behavior_log_probs: Tensor,
        advantages: Tensor,
        action_mask: Tensor,
        *,
        entropies: Tensor | None,
        failures: Tensor | None,
        num_sequences: int | None,
        num_tokens: int | Tensor | None,
        rewards: Tensor | None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        filter_name = self._names["token_filter"] if self.needs_entropies else None
        if self.validate:
            check_loss_structure(
                log_probs,
                behavior_log_probs,
                advantages,
                action_mask,
                entropies=entropies,
                failures=failures,
                filter_name=filter_name,
                num_sequences=num_sequences,
                num_tokens=num_tokens,
            )
        mask = action_mask
        dtype = compute_dtype(log_probs)
        ent = entropies.detach() if filter_name is not None and entropies is not None else None
        batch = TokenBatch(
            log_probs.to(dtype),  # carries the gradient; masked slots may hold anything
            behavior_log_probs.detach().to(dtype),
            advantages.detach().to(dtype),
            mask,
        )
        if self.validate:
            _check_values(batch, rewards, ent, num_tokens)

        batch.keep = self.token_filter(mask, ent, failures)
        tr = self.trust_region(batch)
        if self.validate:
            check_trust_region_output(tr, batch, self.trust_region)
        # -w_{i,t} A_i is detached and exactly 0 off the kept, admitted tokens; the aggregation
        # selects kept slots with torch.where, so NaN/inf in masked log-probs never reach loss
        # or gradient.
        coef = tr.weights * batch.advantages.neg().unsqueeze(1)
        num_sequences = mask.shape[0] if num_sequences is None else num_sequences
        num_tokens = batch.policy_tokens.sum() if num_tokens is None else num_tokens
        loss = self.aggregation(
            coef * batch.log_probs,
            batch.keep,
            mask,
            num_sequences=num_sequences,
            num_tokens=num_tokens,
        )
        return loss, _diagnostics(tr, batch)


def _check_values(
    batch: TokenBatch,
    rewards: Tensor | None,
    entropies: Tensor | None,
    num_tokens: int | Tensor | None,
) -> None:
    """One call's values checked in one fused device reduction: validation costs one host sync."""
    checks = ValueChecks(batch.action_mask, batch.dtype)
    checks.empty_rows(batch.policy_tokens)
    if rewards is not None:
        checks.finite_rows(rewards, "rewards")
    checks.finite_rows(batch.advantages, "advantages")
    checks.log_probs(batch.log_probs, "log_probs")
    checks.log_probs(batch.behavior_log_probs, "behavior_log_probs")
    if entropies is not None:
        checks.entropies(entropies)
    if num_tokens is not None:
        checks.token_count(batch.policy_tokens, num_tokens)
    checks.raise_first()


def _diagnostics(tr: TrustRegionOutput, batch: TokenBatch) -> dict[str, Tensor]:
    """The reference's diagnostics plus the trust region's own (all detached)."""
    keep, mask = batch.keep, batch.action_mask
    if keep is mask and tr.token_admitted is None:
        retained = torch.where(tr.admitted, batch.policy_tokens, 0)
    else:
        gate = tr.token_admitted if tr.token_admitted is not None else tr.admitted.unsqueeze(1)
        retained = count_per_row(keep & gate)
    diagnostics = {k: v.detach() for k, v in tr.diagnostics.items()}
    diagnostics.update(
        advantages=batch.advantages,
        sequence_kl=batch.sequence_kl,
        admitted=tr.admitted.detach(),
        acceptance_rate=tr.admitted.float().mean(),
        policy_tokens=batch.policy_tokens,
        retained_tokens=retained,
    )
    return diagnostics
