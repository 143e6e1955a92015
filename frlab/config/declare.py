"""What a key's declaration adds to its type: `spec(default, low=, high=, choices=, doc=, arg=)`.

A section of the config is a dataclass (frlab.config.schema): each field's annotation is the
key's type and its default the key's default. OmegaConf enforces the types and refuses unknown
keys (Hydra composes over the dataclasses, registered as structured configs; a config built
some other way is merged onto them by `frlab.config.preflight.structured`). `spec` adds what a
type cannot say: an inclusive or open range, a list of choices, a list of exactly two numbers,
a one-line description, and whether the key is an argument of the section's `_target_`
(`arg=False`: read by frlab itself, left out when the section is instantiated).
`check_values` checks those rules on the resolved values, naming the full key.
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


def spec(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING,
         **rules: Any) -> Any:  # fmt: skip
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


def join(prefix: str, name: object) -> str:
    return f"{prefix}.{name}" if prefix else str(name)


def check_node(key: str, values: Mapping[str, Any], cls: type) -> None:
    """An untyped node (`eval`, a benchmark mapping) against its declaration `cls`: types and
    unknown keys by OmegaConf (as Hydra checks the typed sections), then `check_values`."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from frlab.config.errors import omegaconf_error

    declared_node, given = OmegaConf.structured(cls), dict(values)
    for part in reversed(key.split(".")):  # nested under the full key, so errors name it
        declared_node, given = {part: declared_node}, {part: given}
    try:
        OmegaConf.merge(OmegaConf.create(declared_node), given)
    except OmegaConfBaseException as exc:
        raise omegaconf_error(exc) from exc
    check_values(key, values, cls)


def check_values(key: str, values: Mapping[str, Any], cls: type) -> None:
    """The declared ranges and choices of `cls` on resolved `values` (nested sections too),
    and booleans that are booleans; other types and unknown keys are OmegaConf's to check."""
    for f, annotation in declared(cls):
        if f.name not in values:
            continue
        value, sub, meta = values[f.name], section_type(annotation), meta_of(f)
        kind = meta.kind or unwrap(annotation)[0]
        if sub is not None and isinstance(value, Mapping):
            check_values(join(key, f.name), value, sub)
        elif value in meta.words:
            continue
        elif kind is bool and not is_boolean(value):
            # OmegaConf would read 3 as true: a key declared bool takes only booleans
            raise ConfigError(join(key, f.name), f"must be {_either('true', 'false', meta)}, "
                              f"got {value!r}")  # fmt: skip
        elif kind is int and not (value is None or _is_int(value)):
            raise ConfigError(join(key, f.name), f"must be {_either('an int', 'null', meta)}, "
                              f"got {value!r}")  # fmt: skip
        elif value is not None:
            check_value(join(key, f.name), value, meta)


def _is_int(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or str(value).startswith("${")


def _either(first: str, second: str, meta: Meta) -> str:
    """`true or false`, or `true, false or auto` for a key that takes words too."""
    options = [first, second, *meta.words]
    return f"{', '.join(options[:-1])} or {options[-1]}"


def is_boolean(value: Any) -> bool:
    """What a key declared bool may hold: a boolean, null, or an interpolation (resolved later)."""
    return value is None or isinstance(value, bool) or str(value).startswith("${")


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


def default_of(f: dataclasses.Field) -> Any:
    """A field's declared default (`dataclasses.MISSING` when it has none)."""
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return f.default


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


def declared_annotation(cls: type, key: str) -> Any:
    """The declared type of dotted `key` below `cls` (None: not declared, see declared_field)."""
    found = declared_field(cls, key)
    return None if found is None else found[1]


def declared_bool(
    root: type, key: str, nodes: Mapping[str, tuple[type, ...]] | None = None
) -> bool:
    """Whether dotted `key` is declared bool below `root`, or, below one of `nodes` (a key
    declared `Any` that holds a typed node: the chosen engine's, the fleet's), by any of that
    node's declarations."""
    if unwrap(declared_annotation(root, key) or object)[0] is bool:
        return True
    for node, classes in (nodes or {}).items():
        if key.startswith(f"{node}."):
            rest = key.removeprefix(f"{node}.")
            return any(unwrap(declared_annotation(c, rest) or object)[0] is bool for c in classes)
    return False


def non_booleans(
    root: type,
    values: Mapping[str, Any],
    nodes: Mapping[str, tuple[type, ...]] | None = None,
    key: str = "",
) -> Iterator[tuple[str, Any]]:
    """(full key, value) of each raw value below `values` on a key declared bool
    (`declared_bool`) that is not a boolean: OmegaConf, merging, would read 3 as true."""
    for name, value in values.items():
        full = join(key, name)
        if isinstance(value, Mapping):
            yield from non_booleans(root, value, nodes, full)
        elif not is_boolean(value) and declared_bool(root, full, nodes):
            yield full, value


def check_bool_overrides(
    root: type, overrides: list[str], nodes: Mapping[str, tuple[type, ...]] | None = None
) -> None:
    """ConfigError for a command-line value that is not a boolean on a key declared bool
    (`declared_bool`): OmegaConf would turn `data.pack_sequences=3` into True silently (each
    value of a sweep such as `data.pack_sequences=3,false` too)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides=list(overrides))
    except Exception:  # a malformed override: Hydra reports it itself
        return
    for override in parsed:
        key = override.key_or_group.lstrip("+")
        if override.is_delete() or not declared_bool(root, key, nodes):
            continue
        values: list[Any] = [override.value()]
        if override.is_discrete_sweep():
            try:
                values = list(override.sweep_iterator())
            except HydraException:  # a glob() sweep: it lists group options, not values
                continue
        for value in values:
            if not is_boolean(value):
                shown = value if override.is_discrete_sweep() else override.get_value_string()
                raise ConfigError(key, f"must be true or false, got {shown}")
