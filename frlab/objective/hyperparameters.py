"""Hyperparameter declarations: type, default, range and meaning of a component's settings.

A component's hyperparameters are the fields of its (frozen) dataclass, each declared once with
`hyperparameter(default, low=..., high=..., doc=...)`. Everything else reads that declaration:
construction-time validation (`Hyperparameter.check`), the config defaults
(`configs/objective/params/default.yaml`), the `objective` node's checks
(`Objective.from_config`, whose errors preflight reports),
the dry-run plan and the generated docs (`frlab.objective.catalog`).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import operator
from dataclasses import dataclass
from typing import Any

from frlab.registry import did_you_mean

METADATA_KEY = "frlab_hyperparameter"


class HyperparameterError(ValueError):
    """A setting that does not fit its declaration; `key` names it (e.g. `token_tis.cap`).
    For an unknown name, `name` and the valid `choices` (the closest ones are suggested)."""

    def __init__(
        self, key: str, reason: str, *, name: str | None = None, choices: tuple[str, ...] = ()
    ) -> None:
        self.key, self.reason, self.name, self.choices = key, reason, name, tuple(choices)
        hint = did_you_mean(name, list(choices)) if name is not None else ""
        listed = f" (declared: {', '.join(choices)})" if choices else ""
        super().__init__(f"{key} {reason}{hint}{listed}")


@dataclass(frozen=True)
class Hyperparameter:
    """One hyperparameter: `kind` "float" or "int", default, inclusive or open bounds, doc.

    `finite=True` refuses +-inf for a float (without it, inf is a valid float when the bounds
    admit it, e.g. a trust-region threshold delta = inf admits everything).
    """

    name: str
    kind: str
    default: Any
    doc: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    finite: bool = False

    def range_text(self) -> str:
        """The admitted range as an interval: `[0, inf]`, `(0, inf)` (finite), `[0, 1]`."""
        lo = "(" if self.low_open or (self.low is None and self.finite) else "["
        unbounded = self.high is None and (self.finite or self.kind == "int")
        hi = ")" if self.high_open or unbounded else "]"
        low = "-inf" if self.low is None else _num(self.low)
        high = "inf" if self.high is None else _num(self.high)
        return f"{lo}{low}, {high}{hi}"

    def check(self, value: object, key: str | None = None) -> Any:
        """`value` converted to the declared kind; HyperparameterError naming `key` if invalid."""
        key = key or self.name
        out = self._convert(value, key)
        if isinstance(out, float) and math.isnan(out):
            raise HyperparameterError(key, "must not be NaN")
        if self.finite and math.isinf(out):
            raise HyperparameterError(key, f"must be finite, in {self.range_text()}, got {out}")
        below = self.low is not None and (out < self.low or (self.low_open and out == self.low))
        above = self.high is not None and (out > self.high or (self.high_open and out == self.high))
        if below or above:
            raise HyperparameterError(key, f"must be in {self.range_text()}, got {out}")
        return out

    def _convert(self, value: object, key: str) -> Any:
        value = _scalar(value)
        if self.kind == "int":
            try:
                if isinstance(value, bool):
                    raise TypeError
                return operator.index(value)
            except TypeError:
                raise HyperparameterError(key, f"must be an integer, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise HyperparameterError(key, f"must be a real number, got {value!r}")
        return float(value)


def _scalar(value: object) -> object:
    """A 0-d torch tensor (e.g. `delta=torch.tensor(3e-3)`) as its Python number."""
    if type(value).__module__ == "torch" and getattr(value, "dim", None) is not None:
        tensor: Any = value
        if tensor.dim() == 0 and not (tensor.is_complex() or str(tensor.dtype) == "torch.bool"):
            return tensor.item()
    return value


def _num(x: float) -> str:
    return repr(x) if isinstance(x, float) and not x.is_integer() else f"{x:g}"


def hyperparameter(
    default: Any,
    *,
    doc: str,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    finite: bool = False,
) -> Any:
    """A dataclass field declaring one hyperparameter (its type comes from the annotation)."""
    spec = {
        "default": default,
        "doc": doc,
        "low": low,
        "high": high,
        "low_open": low_open,
        "high_open": high_open,
        "finite": finite,
    }
    return dataclasses.field(default=default, metadata={METADATA_KEY: spec})


def declared(cls: type) -> tuple[Hyperparameter, ...]:
    """The hyperparameters of a component dataclass, in field order."""
    out = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(METADATA_KEY)
        if spec is None:
            raise TypeError(
                f"{cls.__name__}.{f.name} is a dataclass field without `hyperparameter(...)`: "
                "declare its default, range and doc with frlab.objective.hyperparameter"
            )
        kind = _kind(f.type, cls, f.name)
        out.append(Hyperparameter(name=f.name, kind=kind, **spec))
    return tuple(out)


def _kind(annotation: object, cls: type, name: str) -> str:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    if text in ("float", "int"):
        return str(text)
    raise TypeError(f"{cls.__name__}.{name}: a hyperparameter is `float` or `int`, got {text!r}")
