"""Public base classes of the four component kinds, their helpers, and the name registries.

A component is a frozen dataclass subclassing its kind's base class; its fields are its
hyperparameters, each declared once with `hyperparameter(default, doc=..., low=..., ...)`.
The first line of its docstring is its maths in one line (the README table shows it) and
`source` cites where it comes from. Registered under a short name, it becomes selectable as
`objective.<kind>=<name>` with its settings under `objective.<name>.<field>`:

    @TRUST_REGIONS.register("max_log_ratio")
    @dataclass(frozen=True)
    class MaxLogRatio(TrustRegion):
        '''Admit a trajectory iff max_t |log rho_t| <= bound; weights = rho.'''

        bound: float = hyperparameter(0.5, low=0.0, doc="largest |log rho| admitted")
        diagnostics = (Diagnostic("max_abs_log_ratio", "max_t |log rho_t|", per="row"),)

        def __call__(self, batch: TokenBatch) -> TrustRegionOutput:
            worst = batch.log_ratio.abs().amax(dim=1)
            return self.admit_rows(batch, worst <= self.bound, max_abs_log_ratio=worst)

Return contracts (tensors are detached; B rows, T positions):
- Baseline:    `__call__(rewards [B], group_ids [B] | None) -> advantages [B]`.
- TokenFilter: `__call__(action_mask [B,T], entropies [B,T] | None, failures [B] | None)
               -> keep [B,T]` bool, a subset of the mask (return the mask itself to keep all).
- TrustRegion: `__call__(batch: TokenBatch) -> TrustRegionOutput(weights [B,T], admitted [B],
               diagnostics, token_admitted [B,T] | None)`; build it with `admit_rows`,
               `admit_tokens` or `weigh_rows`, which put weights only on kept policy tokens and
               raise `FloatingPointError` if an admitted weight overflowed. The diagnostics
               returned must be exactly the declared `diagnostics` (checked by the objective).
- Aggregation: `__call__(token_terms [B,T], keep [B,T], action_mask [B,T], *, num_sequences,
               num_tokens) -> scalar loss`, normalised by the GLOBAL batch (num_sequences =
               global B, num_tokens = global policy-token count), so micro-batch losses sum to
               the full-batch loss. Select terms with `torch.where`, never a 0/1 multiply.
The per-token loss term is `-weights * A_i * log_probs`; the objective computes the sequence KL
it logs itself (`TokenBatch.sequence_kl`), no component has to return it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from frlab.objective.hyperparameters import Hyperparameter, declared, hyperparameter
from frlab.objective.statistics import TokenBatch, count_per_row
from frlab.registry import Registry, RegistryError

__all__ = [
    "AGGREGATIONS",
    "BASELINES",
    "TOKEN_FILTERS",
    "TRUST_REGIONS",
    "Aggregation",
    "Baseline",
    "Component",
    "Diagnostic",
    "TokenBatch",
    "TokenFilter",
    "TrustRegion",
    "TrustRegionOutput",
    "compute_dtype",
    "count_per_row",
    "hyperparameter",
]


def compute_dtype(log_probs: Tensor) -> torch.dtype:
    """The working dtype, keyed on `log_probs` alone: float64 stays float64, every other dtype
    (bf16, fp16, fp32) is computed in float32."""
    return torch.float64 if log_probs.dtype == torch.float64 else torch.float32


@dataclass(frozen=True)
class Diagnostic:
    """A statistic a trust region returns, logged as `train/<component>/<name>[_mean]`.

    per="row": a [B] tensor, logged as the mean over the learner batch's rows (`_mean` added);
    per="token": a 0-d tensor, the fraction (or mean) over this call's policy tokens, logged
    weighted by policy tokens, i.e. exactly the value over the whole learner batch.
    """

    name: str
    doc: str
    per: Literal["row", "token"] = "row"

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.per not in ("row", "token"):
            raise ValueError(
                f"Diagnostic({self.name!r}, per={self.per!r}): the name must be an identifier "
                "and per 'row' or 'token'"
            )

    def metric(self, component: str) -> str:
        """The metric name under which the learner logs it for `component`."""
        return f"train/{component}/{self.name}{'_mean' if self.per == 'row' else ''}"


# Keys of the objective's own diagnostics (the reference's), not available to components.
RESERVED_DIAGNOSTICS = frozenset(
    {"advantages", "sequence_kl", "admitted", "acceptance_rate", "policy_tokens", "retained_tokens"}
)


class Component:
    """Base of every component: a frozen dataclass whose fields are declared hyperparameters.

    `name` is set by registration; `source` is the citation shown in the docs. Construction
    validates every field against its declaration (ValueError naming `<name>.<field>`), then
    runs `check()`, the place for rules between fields.
    """

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""
    source: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for spec in self.hyperparameters():
            value = spec.check(
                getattr(self, spec.name), f"{self.name or type(self).__name__}.{spec.name}"
            )
            object.__setattr__(self, spec.name, value)
        self.check()

    def check(self) -> None:
        """Rules between hyperparameters (override; raise ValueError naming the fields)."""

    @classmethod
    def hyperparameters(cls) -> tuple[Hyperparameter, ...]:
        """The declared hyperparameters, in field order."""
        return declared(cls) if dataclasses.is_dataclass(cls) else ()

    @classmethod
    def spec(cls, name: str) -> Hyperparameter:
        """The declaration of hyperparameter `name` (KeyError if there is none)."""
        for h in cls.hyperparameters():
            if h.name == name:
                return h
        raise KeyError(f"{cls.__name__} declares no hyperparameter {name!r}")

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """{field: default} of the declared hyperparameters."""
        return {h.name: h.default for h in cls.hyperparameters()}

    @classmethod
    def summary(cls) -> str:
        """The maths in one line: the first line of the class's own docstring ("" if none)."""
        doc = (cls.__dict__.get("__doc__") or "").strip()
        if not doc or doc.startswith(f"{cls.__name__}("):  # dataclass's generated signature
            return ""
        return doc.splitlines()[0]

    def params(self) -> dict[str, Any]:
        """{field: value} of this instance's hyperparameters."""
        return {h.name: getattr(self, h.name) for h in self.hyperparameters()}

    def describe(self, name: str) -> str:
        """`name p=v ...` with this instance's hyperparameters; for one without any, `name: `
        and its maths in one line (as the README's component table)."""
        values = [
            f"{p}={float(v)!r}" if isinstance(v, float) else f"{p}={v}"
            for p, v in self.params().items()
        ]
        return " ".join([name, *values]) if values else f"{name}: {self.summary().rstrip('.')}"


class Baseline(Component):
    """rewards [B] (+ group ids) -> detached advantages [B]; `is_group`: needs > 1 per prompt."""

    kind: ClassVar[str] = "baseline"
    is_group: ClassVar[bool] = False

    def __call__(self, rewards: Tensor, group_ids: Tensor | None = None) -> Tensor:
        raise NotImplementedError


class TokenFilter(Component):
    """(action_mask, entropies, failures) -> keep [B,T] bool, a subset of the mask."""

    kind: ClassVar[str] = "token_filter"

    @property
    def needs_entropies(self) -> bool:
        """True when this filter reads entropies [B,T] and failures [B]."""
        return False

    def __call__(
        self, action_mask: Tensor, entropies: Tensor | None = None, failures: Tensor | None = None
    ) -> Tensor:
        raise NotImplementedError


class Aggregation(Component):
    """Per-token loss terms [B,T] -> one scalar, with GLOBAL normalisers."""

    kind: ClassVar[str] = "aggregation"

    def __call__(
        self,
        token_terms: Tensor,
        keep: Tensor,
        action_mask: Tensor,
        *,
        num_sequences: int | Tensor,
        num_tokens: int | Tensor,
    ) -> Tensor:
        raise NotImplementedError


@dataclass
class TrustRegionOutput:
    """Detached per-token weights (0 off kept policy tokens), admission [B], diagnostics.

    A token-level gate also sets `token_admitted [B,T]`; when None the gate is
    `admitted[:, None]`.
    """

    weights: Tensor
    admitted: Tensor
    diagnostics: dict[str, Tensor] = field(default_factory=dict)
    token_admitted: Tensor | None = None


class TrustRegion(Component):
    """TokenBatch -> TrustRegionOutput: per-token weights, the admission gate, diagnostics.

    `off_policy_correction` is False only when the weights ignore the behaviour policy (the
    sampler may then truncate its distribution). `admits_all` is True when every trajectory is
    admitted by construction: the learner then logs no `train/acceptance_rate` (it would be 1
    whatever happens) and the component's own diagnostics say what it did instead.
    """

    kind: ClassVar[str] = "trust_region"
    off_policy_correction: ClassVar[bool] = True
    admits_all: ClassVar[bool] = False
    diagnostics: ClassVar[tuple[Diagnostic, ...]] = ()

    def __call__(self, batch: TokenBatch) -> TrustRegionOutput:
        raise NotImplementedError

    def admit_rows(
        self, batch: TokenBatch, admitted: Tensor, **diagnostics: Tensor
    ) -> TrustRegionOutput:
        """weights = rho on the kept tokens of admitted rows, 0 elsewhere."""
        weights = torch.where(batch.keep & admitted.unsqueeze(1), batch.ratio, 0.0)
        return TrustRegionOutput(self.finite(weights), admitted, diagnostics)

    def admit_tokens(
        self, batch: TokenBatch, token_ok: Tensor, **diagnostics: Tensor
    ) -> TrustRegionOutput:
        """weights = rho on kept tokens where `token_ok`; a row is admitted if any token is."""
        ok = token_ok & batch.action_mask
        weights = torch.where(batch.keep & ok, batch.ratio, 0.0)
        return TrustRegionOutput(self.finite(weights), ok.any(dim=1), diagnostics, ok)

    def weigh_rows(
        self, batch: TokenBatch, weights: Tensor, **diagnostics: Tensor
    ) -> TrustRegionOutput:
        """Custom per-token weights on kept tokens (0 elsewhere), every row admitted."""
        weights = torch.where(batch.keep, weights, 0.0)
        return TrustRegionOutput(self.finite(weights), batch.all_rows(), diagnostics)

    def finite(self, weights: Tensor) -> Tensor:
        """`weights`, or FloatingPointError if one overflowed (one host sync)."""
        if math.isfinite(weights.amax().item()):
            return weights
        rows = (~torch.isfinite(weights)).any(dim=1).nonzero().flatten().tolist()
        raise FloatingPointError(
            f"trust region {self.name!r}: importance ratio rho = exp(current - behaviour) is not "
            f"finite on an admitted policy token in row(s) {rows[:10]}; the behaviour log-probs "
            "are far below the current ones (stale or wrong behaviour log-probs?)"
        )


class ComponentRegistry(Registry[type]):
    """A registry of one kind that accepts only well-formed component classes."""

    def __init__(self, base: type[Component]) -> None:
        super().__init__(base.kind)
        self.base = base

    def register(self, name: str) -> Any:
        """Class decorator: check the class, set its `name`, register it."""

        def deco(cls: type) -> type:
            _check_component_class(cls, self.base, name)
            _check_shared_name(cls, name)
            cls.name = name  # type: ignore[attr-defined]
            return super(ComponentRegistry, self).register(name)(cls)

        return deco

    def in_order(self) -> list[type[Component]]:
        """The registered classes in registration order (the order of their files)."""
        return list(self._entries.values())  # type: ignore[arg-type]


def _check_shared_name(cls: type, name: str) -> None:
    """A name may be registered in several kinds (`none`) only if none of them has
    hyperparameters: they would share the config node `objective.<name>`."""
    for registry in _ALL:
        if name in registry and registry.base is not _kind_base(cls):
            other = registry.get(name)
            if other.hyperparameters() or cls.hyperparameters():  # type: ignore[attr-defined]
                raise RegistryError(
                    f"{name!r} is already a {registry.kind}; a component with hyperparameters "
                    "needs a name of its own (its settings live under objective.<name>)"
                )


def _kind_base(cls: type) -> type | None:
    return next((r.base for r in _ALL if issubclass(cls, r.base)), None)


def _check_component_class(cls: type, base: type[Component], name: str) -> None:
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise RegistryError(f"{base.kind} {name!r} must subclass frlab.objective.{base.__name__}")
    params = getattr(cls, "__dataclass_params__", None)
    if "__dataclass_fields__" not in cls.__dict__ or params is None or not params.frozen:
        raise RegistryError(
            f"{base.kind} {name!r}: decorate {cls.__name__} with @dataclass(frozen=True)"
        )
    if not cls.summary():
        raise RegistryError(f"{base.kind} {name!r}: {cls.__name__} needs a docstring (its maths)")
    try:
        specs = cls.hyperparameters()
    except TypeError as exc:
        raise RegistryError(str(exc)) from exc
    if "name" in {h.name for h in specs}:
        raise RegistryError(f"{base.kind} {name!r}: `name` is reserved, rename that field")
    taken = {d.name for d in getattr(cls, "diagnostics", ())} & RESERVED_DIAGNOSTICS
    if taken:
        raise RegistryError(
            f"{base.kind} {name!r}: diagnostics {sorted(taken)} are reported by the objective "
            "itself; choose other names"
        )


BASELINES = ComponentRegistry(Baseline)
TRUST_REGIONS = ComponentRegistry(TrustRegion)
AGGREGATIONS = ComponentRegistry(Aggregation)
TOKEN_FILTERS = ComponentRegistry(TokenFilter)
_ALL = (BASELINES, TRUST_REGIONS, AGGREGATIONS, TOKEN_FILTERS)
