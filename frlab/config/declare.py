"""What a key's declaration adds to its type: `spec(default, low=, high=, choices=, doc=, arg=)`.

A section of the config is a dataclass (frlab.config.schema): each field's annotation is the
key's type and its default the key's default; OmegaConf enforces the types and refuses unknown
keys. `spec` adds what a type cannot say: an inclusive or open range, a list of choices, a
list of exactly two numbers, a one-line description, and whether the key is an argument of
the section's `_target_` (`arg=False`: read by frlab itself, left out when it is built).
`check_values` checks those rules on resolved values; `check_booleans` refuses a value that is
not a boolean on a key declared bool (OmegaConf would read 3 as true); errors name the full key.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from frlab.config.errors import ConfigError, from_omegaconf

META = "frlab"
# Keys declared `Any` that hold a typed node: their possible declarations (frlab.config.schema).
Nodes = Mapping[str, tuple[type, ...]]


@dataclass(frozen=True)
class Meta:
    """What `spec` adds to a dataclass field."""

    doc: str = ""
    choices: tuple[str, ...] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # exclude `low` itself
    high_open: bool = False
    pair: bool = False  # a list of exactly two numbers
    arg: bool = True  # passed to the section's `_target_` when it is instantiated
    # A key that takes words beside a value of one type (`model.gradient_checkpointing`: a
    # bool or `auto`) is declared `Any` for OmegaConf; `kind` is that type, `words` the words.
    kind: type | None = None
    words: tuple[str, ...] = ()


def spec(
    default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, **rules: Any
) -> Any:
    """A dataclass field with frlab's rules (`Meta`'s fields: range, choices, doc, arg)."""
    meta = {META: Meta(**rules)}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def meta_of(f: dataclasses.Field) -> Meta:
    return f.metadata.get(META, Meta())


def unwrap(annotation: Any) -> tuple[Any, bool]:
    """(the type inside Optional[...] / `X | None`, whether None is allowed)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else Any), True
    return annotation, annotation is Any


def section_type(annotation: Any) -> type | None:
    """The dataclass a field holds (a nested section), if any."""
    inner, _ = unwrap(annotation)
    return inner if dataclasses.is_dataclass(inner) else None


def declared(cls: type) -> Iterator[tuple[dataclasses.Field, Any]]:
    """(field, evaluated annotation) for every key of a config dataclass."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        yield f, hints[f.name]


def not_args(cls: type) -> tuple[str, ...]:
    """Keys of `cls` that are not arguments of its `_target_` (`spec(arg=False)`)."""
    return tuple(f.name for f, _ in declared(cls) if not meta_of(f).arg)


def default_of(f: dataclasses.Field) -> Any:
    """A field's declared default (`dataclasses.MISSING` when it has none)."""
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return f.default


def join(prefix: str, name: object) -> str:
    return f"{prefix}.{name}" if prefix else str(name)


def check_node(key: str, values: Mapping[str, Any], cls: type) -> None:
    """An untyped node (`eval`, a benchmark mapping) against its declaration `cls`: types and
    unknown keys by OmegaConf (as Hydra checks the typed sections), then `check_values`."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    # raw values first: the merge below would read 3 as true on a key declared bool
    check_booleans(
        (join(key, f.name), values[f.name])
        for f, a in declared(cls)
        if f.name in values and unwrap(a)[0] is bool
    )
    declared_node, given = OmegaConf.structured(cls), dict(values)
    for part in reversed(key.split(".")):  # nested under the full key, so errors name it
        declared_node, given = {part: declared_node}, {part: given}
    try:
        OmegaConf.merge(OmegaConf.create(declared_node), given)
    except OmegaConfBaseException as exc:
        raise from_omegaconf(exc) from exc
    check_values(key, values, cls)


def check_values(key: str, values: Mapping[str, Any], cls: type) -> None:
    """The declared ranges and choices of `cls` on resolved `values` (nested sections too), and
    the type of a key that takes words beside it (`kind`); other types and unknown keys are
    OmegaConf's to check."""
    for f, annotation in declared(cls):
        if f.name not in values:
            continue
        value, sub, meta, full = (
            values[f.name],
            section_type(annotation),
            meta_of(f),
            join(key, f.name),
        )
        if sub is not None and isinstance(value, Mapping):
            check_values(full, value, sub)
        elif value in meta.words:
            continue
        elif meta.kind is bool and not isinstance(value, bool):
            raise ConfigError(full, f"must be {_either('true', 'false', meta)}, got {value!r}")
        elif meta.kind is int and not (value is None or _is_int(value)):
            raise ConfigError(full, f"must be {_either('an int', 'null', meta)}, got {value!r}")
        elif value is not None:
            check_value(full, value, meta)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _either(first: str, second: str, meta: Meta) -> str:
    """`true, false or auto`: what a key that takes words beside its type may hold."""
    options = [first, second, *meta.words]
    return f"{', '.join(options[:-1])} or {options[-1]}"


def check_value(key: str, value: Any, meta: Meta) -> None:
    """Raise ConfigError unless `value` fits the rules of `meta`."""
    if meta.pair:
        if not isinstance(value, list | tuple) or len(value) != 2:
            raise ConfigError(key, f"must be a list of two numbers, got {value!r}")
        for i, x in enumerate(value):
            check_value(f"{key}[{i}]", x, dataclasses.replace(meta, pair=False))
        return
    if meta.choices is not None and value not in meta.choices:
        raise ConfigError(key, f"unknown value {value!r}", value=value, choices=meta.choices)
    if isinstance(value, int | float) and not isinstance(value, bool):
        if math.isnan(value):
            raise ConfigError(key, "must not be NaN")
        low, high = meta.low, meta.high
        below = low is not None and (value < low or (meta.low_open and value == low))
        above = high is not None and (value > high or (meta.high_open and value == high))
        if below or above:
            raise ConfigError(key, f"must be in {interval(meta)}, got {value:g}")


def interval(meta: Meta) -> str:
    """`[0, 1)`-style text of a declared range ("" when the key has none)."""
    if meta.low is None and meta.high is None:
        return ""
    low = "-inf" if meta.low is None else f"{meta.low:g}"
    high = "inf" if meta.high is None else f"{meta.high:g}"
    return f"{'(' if meta.low_open else '['}{low}, {high}{')' if meta.high_open else ']'}"


def changed(key: str, values: Mapping[str, Any], cls: type) -> dict[str, Any]:
    """{full key: value} of the keys whose value differs from the declared default (keys that
    follow another key by interpolation and the `_target_` wiring are left out)."""
    out: dict[str, Any] = {}
    for f, annotation in declared(cls):
        if f.name.startswith("_") or f.name not in values:
            continue
        full, value = join(key, f.name), values[f.name]
        sub = section_type(annotation)
        if sub is not None and isinstance(value, Mapping):
            out.update(changed(full, value, sub))
            continue
        default = default_of(f)
        if isinstance(default, str) and default.startswith("${"):
            continue
        if isinstance(value, Mapping) or value != default or default == "???":
            out[full] = value
    return out


def declared_field(cls: type, key: str) -> tuple[dataclasses.Field, Any] | None:
    """(field, declared type) of dotted `key` below config dataclass `cls` (None: not declared
    there, or inside an open node such as `env` or `rollout.engine`)."""
    head, _, rest = key.partition(".")
    for f, annotation in declared(cls):
        if f.name == head:
            inner = section_type(annotation)
            if not rest:
                return f, annotation
            return None if inner is None else declared_field(inner, rest)
    return None


def declared_bool(root: type, key: str, nodes: Nodes) -> bool:
    """Whether dotted `key` is declared bool below `root`, or, below one of `nodes` (keys
    declared `Any` that hold a typed node: the engine's, the fleet's, `eval`), by any of that
    node's declarations. (A key declared `Any` keeps its raw value: `check_values` reads it.)"""
    for node, classes in nodes.items():
        if key.startswith(f"{node}."):
            return any(declared_bool(c, key.removeprefix(f"{node}."), {}) for c in classes)
    found = declared_field(root, key)
    return found is not None and unwrap(found[1])[0] is bool


def is_boolean(value: Any) -> bool:
    """What a key declared bool may hold: a boolean, null, or an interpolation (resolved later)."""
    return value is None or isinstance(value, bool) or str(value).startswith("${")


def check_booleans(found: Iterable[tuple[str, Any]]) -> None:
    """The one rule for a key declared bool: a boolean, null or an interpolation."""
    for key, value in found:
        if not is_boolean(value):
            raise ConfigError(key, f"must be true or false, got {value}")
