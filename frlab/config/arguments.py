"""A declaration's keys as a Python caller (a bench, a notebook, a test) passes them: each at its
declared default, with the caller's changes; a default that follows another key
(`${rollout.max_in_flight}`) is that key's declared default in the root (FrlabConfig)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from frlab.config.declare import declared, default_of, meta_of
from frlab.config.schema import FrlabConfig


def declared_arguments(cls: type, **changes: Any) -> dict[str, Any]:
    """What a declaration's `_target_` takes, as a Python caller gives it: `declared_defaults`
    of the keys that are arguments (not `arg=False`), with `changes`."""
    keys = [f.name for f, _ in declared(cls) if meta_of(f).arg]
    return declared_defaults(cls, keys, **changes)


def declared_defaults(cls: type, keys: Iterable[str] | None = None, **changes: Any) -> dict:
    """Every key of a declaration (or those of `keys`; never a `_`-prefixed one) at its declared
    default, with `changes` (nested declarations as plain dicts): the section as a Python caller
    (a bench, a notebook) builds it. A default that follows another key
    (`${rollout.max_in_flight}`) is that key's declared default in the root. TypeError for a
    change that is no such key, or a key without a plain default (required, or following a
    required key) that `changes` leaves out."""
    fields = {f.name: f for f, _ in declared(cls) if not f.name.startswith("_")}
    names = list(fields) if keys is None else [k for k in keys if k in fields]
    unknown = sorted(set(changes) - set(names))
    if unknown:
        raise TypeError(f"{cls.__name__} declares no argument {', '.join(unknown)}")
    out: dict[str, Any] = {}
    for name in names:
        if name in changes:
            out[name] = changes[name]
            continue
        value = followed(default_of(fields[name]))
        if value is dataclasses.MISSING or value == "???" or str(value).startswith("${"):
            raise TypeError(f"{cls.__name__}.{name} has no plain default: give it")
        out[name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return out


def followed(value: Any) -> Any:
    """A default as the root declares it: `${a.b}` (a whole-value interpolation of a root key)
    is `a.b`'s declared default, followed again; `${oc.select:a.b,word}` is that, or `word`
    where the root declares no such key; any other value is itself."""
    seen: set[str] = set()
    while isinstance(value, str) and value.startswith("${") and value.endswith("}"):
        key, fallback = value[2:-1], value
        if key.startswith("oc.select:") and key.count(",") == 1:
            key, fallback = key.removeprefix("oc.select:").split(",")
        if key in seen or ":" in key or "${" in key:
            return value  # a resolver (hydra:...), a nested or a circular interpolation
        seen.add(key)
        value = root_default(key, fallback)
    return value


def root_default(key: str, missing: Any) -> Any:
    """The declared default of the root key `key` (`rollout.max_in_flight`); `missing` where the
    root declares no such key."""
    node: Any = FrlabConfig
    for part in key.split("."):
        fields = (
            {f.name: f for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else {}
        )
        if part not in fields:
            return missing
        node = default_of(fields[part])
    return node
