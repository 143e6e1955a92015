"""Per-row Python references of the objective components, one per registered component.

`tests/objective/test_objective_loops.py` compares the vectorised `Objective` against these in
every combination of trust region, aggregation and token filter (and every baseline on its
own), and fails, naming this file, for a registered component without a reference here: a new
component adds its reference next to its class (docs/extending.md, "A new objective component").

A reference is written for obviousness, not speed: plain Python floats, one row and one token
at a time, every formula spelled out as in the FlashREINFORCE paper and the component
docstrings (p, q clamped to [1e-6, 1 - 1e-6] and `log(1 - p)` written literally). It is a
function registered with `@reference(kind, name, params=...)` and takes the component's
hyperparameters as keyword arguments (the built component's values); `params` gives the values
the comparison runs with (a mapping, or a function of the batch's `Row`s, e.g. a gate threshold
placed halfway between two observed statistics so that rounding cannot flip a decision), the
declared defaults where it is left out. What each kind's function takes and returns:

- baseline:     `f(rewards, group_ids, **hp) -> advantages` (lists of length B);
- token filter: `f(entropies, failed, **hp) -> keep`, over one row's policy tokens;
- trust region: `f(row, **hp) -> (weights, admitted)`, one `Row` (its `keep` and `advantage`
                set), per policy token: the weight and whether the gate lets the token through
                (the same value on every token of a sequence gate); the row counts as admitted
                if any token is;
- aggregation:  `f(terms, keep, **hp) -> loss`: `terms[i]` holds row i's per-policy-token loss
                terms `-w A log pi` (0 where not kept) for all B rows of the learner batch, so
                B = len(terms) and the policy-token count is the sum of the row lengths. The
                comparison takes its gradient from the same function (the loss is linear in the
                kept terms: the coefficient of a term is the loss of a batch of zeros with a 1
                there).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

LOOP_FILE = "tests/helpers/objective_loops.py"
EPS = 1e-6


@dataclass(frozen=True)
class Row:
    """One trajectory's policy tokens, in order, as plain Python values."""

    log_probs: list[float]  # current log pi
    behavior_log_probs: list[float]  # log mu
    entropies: list[float]
    failed: bool
    keep: list[bool] = field(default_factory=list)  # the token filter's choice
    advantage: float = 0.0

    @property
    def rho(self) -> list[float]:
        return [
            math.exp(c - b) for c, b in zip(self.log_probs, self.behavior_log_probs, strict=True)
        ]

    @property
    def d(self) -> list[float]:
        """Per-token Bernoulli KL of behaviour from current."""
        return [
            bernoulli_d(c, b) for c, b in zip(self.log_probs, self.behavior_log_probs, strict=True)
        ]

    @property
    def kl(self) -> float:
        return max(0.0, sum(self.d) / len(self.d))

    @property
    def k3(self) -> float:
        return sum(r - 1 - math.log(r) for r in self.rho) / len(self.rho)

    @property
    def geo(self) -> float:
        return math.exp(sum(math.log(r) for r in self.rho) / len(self.rho))


@dataclass(frozen=True)
class Reference:
    function: Callable[..., Any]
    params: Mapping[str, Any] | Callable[[list[Row]], Mapping[str, Any]]

    def params_for(self, rows: list[Row]) -> dict[str, Any]:
        return dict(self.params(rows) if callable(self.params) else self.params)


REFERENCES: dict[str, dict[str, Reference]] = {
    "baseline": {},
    "trust_region": {},
    "aggregation": {},
    "token_filter": {},
}


def reference(
    kind: str,
    name: str,
    params: Mapping[str, Any] | Callable[[list[Row]], Mapping[str, Any]] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `function` as the per-row reference of component `name` of `kind`."""

    def deco(function: Callable[..., Any]) -> Callable[..., Any]:
        if name in REFERENCES[kind]:
            raise ValueError(f"{kind} {name!r} has two references in {LOOP_FILE}")
        REFERENCES[kind][name] = Reference(function, {} if params is None else params)
        return function

    return deco


def missing_reference(kind: str, name: str) -> str:
    """The failure message for a registered component without a reference."""
    return (
        f"{kind} {name!r} has no per-row reference: add a plain-Python function decorated "
        f"`@reference({kind!r}, {name!r})` to {LOOP_FILE} (its docstring says what a {kind}'s "
        "reference takes and returns; docs/extending.md, 'A new objective component')"
    )


def between(values: list[float], frac: float) -> float:
    """A threshold halfway between two neighbouring sorted values near quantile `frac`."""
    s = sorted(set(values))
    k = min(max(1, int(frac * len(s))), len(s) - 1)
    return 0.5 * (s[k - 1] + s[k])


def clamp_p(x: float) -> float:
    return min(max(x, EPS), 1.0 - EPS)


def bernoulli_d(cur: float, beh: float) -> float:
    p, q = clamp_p(math.exp(beh)), clamp_p(math.exp(cur))
    return p * (math.log(p) - math.log(q)) + (1 - p) * (math.log(1 - p) - math.log(1 - q))


# --------------------------------------------------------------------------- baselines


def _members(r: list[float], g: list[int], i: int) -> list[float]:
    return [r[j] for j in range(len(r)) if g[j] == g[i]]


@reference("baseline", "none")
def no_baseline(r: list[float], g: list[int]) -> list[float]:
    return list(r)


@reference("baseline", "batch_mean")
def batch_mean(r: list[float], g: list[int]) -> list[float]:
    m = sum(r) / len(r)
    return [x - m for x in r]


@reference("baseline", "batch_mean_std")
def batch_mean_std(r: list[float], g: list[int], eps: float) -> list[float]:
    m = sum(r) / len(r)
    std = math.sqrt(sum((x - m) ** 2 for x in r) / len(r))
    return [(x - m) / (std + eps) for x in r]


@reference("baseline", "group_mean")
def group_mean(r: list[float], g: list[int]) -> list[float]:
    return [x - sum(_members(r, g, i)) / len(_members(r, g, i)) for i, x in enumerate(r)]


@reference("baseline", "group_mean_std")
def group_mean_std(r: list[float], g: list[int], eps: float) -> list[float]:
    out = []
    for i, x in enumerate(r):
        members = _members(r, g, i)
        n, m = len(members), sum(members) / len(members)
        std = math.sqrt(sum((y - m) ** 2 for y in members) / (n - 1))
        out.append((x - m) / (std + eps))
    return out


@reference("baseline", "rloo")
def rloo(r: list[float], g: list[int]) -> list[float]:
    out = []
    for i, x in enumerate(r):
        members = _members(r, g, i)
        out.append(x - (sum(members) - x) / (len(members) - 1))
    return out


# --------------------------------------------------------------------------- trust regions


def _row_gate(row: Row, ok: bool) -> tuple[list[float], list[bool]]:
    return [r if ok else 0.0 for r in row.rho], [ok] * len(row.rho)


@reference("trust_region", "no_is")
def no_is(row: Row) -> tuple[list[float], list[bool]]:
    return [1.0] * len(row.rho), [True] * len(row.rho)


@reference("trust_region", "none")
def plain_is(row: Row) -> tuple[list[float], list[bool]]:
    return list(row.rho), [True] * len(row.rho)


@reference(
    "trust_region",
    "token_tis",
    params=lambda rows: {"cap": between([r for row in rows for r in row.rho], 0.6)},
)
def token_tis(row: Row, cap: float) -> tuple[list[float], list[bool]]:
    return [min(r, cap) for r in row.rho], [True] * len(row.rho)


@reference("trust_region", "ppo_clip", params={"eps_low": 0.05, "eps_high": 0.07})
def ppo_clip(row: Row, eps_low: float, eps_high: float) -> tuple[list[float], list[bool]]:
    hi, lo, a = 1 + eps_high, 1 - eps_low, row.advantage
    clipped = [(a > 0 and r > hi) or (a < 0 and r < lo) for r in row.rho]
    return [0.0 if c else r for r, c in zip(row.rho, clipped, strict=True)], [True] * len(row.rho)


@reference(
    "trust_region",
    "token_bernoulli_kl",
    params=lambda rows: {"delta": between([d for row in rows for d in row.d], 0.7)},
)
def token_bernoulli_kl(row: Row, delta: float) -> tuple[list[float], list[bool]]:
    ok = [d <= delta for d in row.d]
    return [r if o else 0.0 for r, o in zip(row.rho, ok, strict=True)], ok


@reference(
    "trust_region",
    "sequence_bernoulli_kl",
    params=lambda rows: {"delta": between([row.kl for row in rows], 0.5)},
)
def sequence_bernoulli_kl(row: Row, delta: float) -> tuple[list[float], list[bool]]:
    return _row_gate(row, row.kl <= delta)


@reference(
    "trust_region",
    "sequence_k3",
    params=lambda rows: {"delta": between([row.k3 for row in rows], 0.5)},
)
def sequence_k3(row: Row, delta: float) -> tuple[list[float], list[bool]]:
    return _row_gate(row, row.k3 <= delta)


@reference(
    "trust_region",
    "geometric_ratio",
    params=lambda rows: {
        "lower": between([row.geo for row in rows], 0.2),
        "upper": between([row.geo for row in rows], 0.8),
    },
)
def geometric_ratio(row: Row, lower: float, upper: float) -> tuple[list[float], list[bool]]:
    return _row_gate(row, lower <= row.geo <= upper)


# --------------------------------------------------------------------------- aggregations


@reference("aggregation", "sample_mean")
def sample_mean(terms: list[list[float]], keep: list[list[bool]]) -> float:
    return sum(sum(row) / len(row) for row in terms) / len(terms)


@reference("aggregation", "token_mean")
def token_mean(terms: list[list[float]], keep: list[list[bool]]) -> float:
    return sum(sum(row) for row in terms) / sum(len(row) for row in terms)


@reference("aggregation", "constant_length", params={"length": 13})
def constant_length(terms: list[list[float]], keep: list[list[bool]], length: int) -> float:
    return sum(sum(row) / length for row in terms) / len(terms)


# --------------------------------------------------------------------------- token filters


@reference("token_filter", "none")
def keep_all(entropies: list[float], failed: bool) -> list[bool]:
    return [True] * len(entropies)


@reference("token_filter", "entropy_failures", params={"q": 0.6})
def entropy_failures(entropies: list[float], failed: bool, q: float) -> list[bool]:
    if not failed or q >= 1.0:
        return [True] * len(entropies)
    k = math.ceil(q * len(entropies))
    chosen = set(sorted(range(len(entropies)), key=lambda j: (-entropies[j], j))[:k])
    return [j in chosen for j in range(len(entropies))]
