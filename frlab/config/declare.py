"""How a config key is declared, and the checks derived from a declaration.

A section of the config is a dataclass (frlab.config.schema): each field's annotation is the
key's type, its default the key's default, and `spec(...)` adds what a type cannot say: an
inclusive or open range, a list of choices, a fixed list length, a one-line description, and
whether the key is an argument of the section's `_target_` (`arg=False`: read by frlab itself,
left out when the section is instantiated). Hydra enforces types and unknown keys while it
composes (the dataclasses are registered as structured configs); `check_declared` checks the
same declaration again on the resolved values (ranges, choices, keys added with `+`), so that
every error is a `ConfigError` naming the full key.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from frlab.config.errors import ConfigError

META = "frlab"


@dataclass(frozen=True)
class Field:
    """One value's rule: its type, whether null is allowed, choices, an inclusive range.

    kind: "int" | "float" | "bool" | "str" | "mapping" | "list" | "float_pair" | "any".
    """

    kind: str
    optional: bool = False
    choices: tuple[str, ...] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # exclude `low` itself
    high_open: bool = False


@dataclass(frozen=True)
class Meta:
    """What `spec` adds to a dataclass field."""

    doc: str = ""
    choices: tuple[str, ...] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    pair: bool = False  # a list of exactly two numbers
    arg: bool = True  # passed to the section's `_target_` when it is instantiated
    kind: str | None = None  # for `Any` fields: the kind of value expected (e.g. "mapping")


def spec(
    default: Any = dataclasses.MISSING,
    *,
    factory: Any = dataclasses.MISSING,
    doc: str = "",
    choices: tuple[str, ...] | None = None,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    pair: bool = False,
    arg: bool = True,
    kind: str | None = None,
) -> Any:
    """A dataclass field with frlab's metadata (range, choices, description, `arg`)."""
    meta = Meta(doc, choices, low, high, low_open, high_open, pair, arg, kind)
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata={META: meta})
    return dataclasses.field(default=default, metadata={META: meta})


def meta_of(f: dataclasses.Field) -> Meta:
    return f.metadata.get(META, Meta())


def hints(cls: type) -> dict[str, Any]:
    """The evaluated annotations of a config dataclass."""
    return typing.get_type_hints(cls)


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


KINDS = {int: "int", float: "float", bool: "bool", str: "str"}


def rule(annotation: Any, meta: Meta) -> Field:
    """The `Field` rule of one declared key."""
    inner, optional = unwrap(annotation)
    origin = typing.get_origin(inner) or inner
    if meta.kind is not None:
        kind = meta.kind
    elif meta.pair:
        kind = "float_pair"
    elif inner in KINDS:
        kind = KINDS[inner]
    elif origin in (dict, Mapping):
        kind = "mapping"
    elif origin in (list, tuple):
        kind = "list"
    else:
        kind = "any"
    return Field(kind, optional, meta.choices, meta.low, meta.high, meta.low_open, meta.high_open)


def declared(cls: type) -> Iterator[tuple[dataclasses.Field, Any]]:
    """(field, annotation) for every key of a config dataclass."""
    types_ = hints(cls)
    for f in dataclasses.fields(cls):
        yield f, types_[f.name]


def not_args(cls: type) -> tuple[str, ...]:
    """Keys of `cls` that are not arguments of its `_target_` (`spec(arg=False)`)."""
    return tuple(f.name for f, _ in declared(cls) if not meta_of(f).arg)


def check_declared(
    key: str, values: Mapping[str, Any], cls: type, root: Mapping[str, Any] | None = None
) -> None:
    """Validate resolved `values` against the declaration `cls`: unknown keys (close matches
    suggested, searched in `root` too), removed keys, types, choices and ranges, nested
    sections included."""
    names = [f.name for f in dataclasses.fields(cls)]
    refused: Mapping[str, str] = getattr(cls, "REFUSED", {})
    for name in values:
        if name not in names:
            why = refused.get(str(name))
            raise unknown_key(join(key, name), names, root or {key: values}, why)
    for f, annotation in declared(cls):
        full = join(key, f.name)
        if f.name not in values:
            raise ConfigError(full, "missing (a declared key cannot be removed)")
        value = values[f.name]
        sub = section_type(annotation)
        if sub is not None:
            if value is None and unwrap(annotation)[1]:
                continue
            if not isinstance(value, Mapping):
                raise ConfigError(full, f"must be a mapping, got {value!r}")
            check_declared(full, value, sub, root)
        else:
            check_value(full, value, rule(annotation, meta_of(f)))


def join(prefix: str, name: object) -> str:
    return f"{prefix}.{name}" if prefix else str(name)


def unknown_key(
    full: str,
    siblings: list[str],
    root: Mapping[str, Any] | None = None,
    why: str | None = None,
    hint: str = "",
) -> ConfigError:
    """The error for a key that is not declared. Suggested: the same name elsewhere in the
    same top-level section (`rollout.temperature` -> `rollout.sampling.temperature`), else
    the closest sibling names."""
    name = full.rsplit(".", 1)[-1]
    if why:
        return ConfigError(full, f"frlab sets this itself: {why}")
    top = full.split(".", 1)[0]
    section = (root or {}).get(top)
    moved = [
        k for k in leaf_keys(section, top) if k.rsplit(".", 1)[-1] == name and k != full
    ] if isinstance(section, Mapping) and "." in full else []  # fmt: skip
    text = f"unknown key {name!r}" + (f" ({hint})" if hint else "")
    return ConfigError(full, text, value=name, choices=siblings, suggestions=moved or None)


def leaf_keys(values: Mapping[str, Any], prefix: str) -> list[str]:
    """Full keys of every value below `values` (depth first)."""
    out: list[str] = []
    for name, value in values.items():
        full = join(prefix, name)
        out.append(full)
        if isinstance(value, Mapping):
            out += leaf_keys(value, full)
    return out


def check_value(key: str, value: Any, spec_: Field) -> None:
    """Raise ConfigError unless `value` fits `spec_`."""
    if value is None:
        if spec_.optional:
            return
        raise ConfigError(key, f"must be set ({describe(spec_.kind)}), got null")
    if spec_.kind == "float_pair":
        if not isinstance(value, list | tuple) or len(value) != 2:
            raise ConfigError(key, f"must be a list of two numbers, got {value!r}")
        item = Field("float", low=spec_.low, high=spec_.high, low_open=spec_.low_open,
                     high_open=spec_.high_open)  # fmt: skip
        for i, x in enumerate(value):
            check_value(f"{key}[{i}]", x, item)
        return
    check_type(key, value, spec_.kind)
    if spec_.choices is not None and value not in spec_.choices:
        raise ConfigError(key, f"unknown value {value!r}", value=value, choices=spec_.choices)
    if spec_.kind in ("int", "float"):
        check_range(key, float(value), spec_)


def check_type(key: str, value: Any, kind: str) -> None:
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
        "mapping": isinstance(value, Mapping),
        "list": isinstance(value, list | tuple),
    }.get(kind, True)
    if not ok:
        raise ConfigError(key, f"must be {describe(kind)}, got {value!r} ({type(value).__name__})")


def describe(kind: str) -> str:
    """A kind in words: 'an integer', 'a number', 'true or false', ..."""
    return {"int": "an integer", "float": "a number", "bool": "true or false",
            "str": "a string", "mapping": "a mapping", "list": "a list",
            "float_pair": "a list of two numbers"}.get(kind, "a value")  # fmt: skip


def check_range(key: str, x: float, spec_: Field) -> None:
    if math.isnan(x):
        raise ConfigError(key, "must not be NaN")
    below = spec_.low is not None and (x < spec_.low or (spec_.low_open and x == spec_.low))
    above = spec_.high is not None and (x > spec_.high or (spec_.high_open and x == spec_.high))
    if below or above:
        raise ConfigError(key, f"must be in {interval(spec_)}, got {x:g}")


def interval(spec_: Field) -> str:
    """`[0, 1)`-style text of a rule's range."""
    lo = "(" if spec_.low_open else "["
    hi = ")" if spec_.high_open else "]"
    low = "-inf" if spec_.low is None else f"{spec_.low:g}"
    high = "inf" if spec_.high is None else f"{spec_.high:g}"
    return f"{lo}{low}, {high}{hi}"


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
        if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        else:
            default = f.default
        if isinstance(default, str) and default.startswith("${"):
            continue
        if isinstance(value, Mapping) or value != default or default == "???":
            out[full] = value
    return out


def declared_annotation(cls: type, key: str) -> Any:
    """The declared type of dotted `key` below config dataclass `cls` (None: not declared
    there, or inside an open node such as `env` or `rollout.engine`)."""
    head, _, rest = key.partition(".")
    for f, annotation in declared(cls):
        if f.name != head:
            continue
        if not rest:
            return annotation
        inner = section_type(annotation)
        return None if inner is None else declared_annotation(inner, rest)
    return None


def check_bool_overrides(root: type, overrides: list[str]) -> None:
    """ConfigError for a command-line value that is not a boolean on a key declared bool:
    OmegaConf would turn `data.pack_sequences=3` into True silently."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides=list(overrides))
    except Exception:  # a malformed override: Hydra reports it itself
        return
    for override in parsed:
        if override.is_sweep_override() or override.is_delete():
            continue
        key = override.key_or_group.lstrip("+")
        if unwrap(declared_annotation(root, key) or object)[0] is not bool:
            continue
        value = override.value()
        if value is not None and not isinstance(value, bool):
            raise ConfigError(
                key, f"must be true or false, got {override.get_value_element_as_str()}"
            )
