"""Name registries for swappable components (baselines, trust regions, aggregations, ...).

One registry per component kind; components are looked up by a short name that describes
their maths. Unknown names fail loudly with the registered names and the closest matches.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    """An unknown or duplicate component name; an unknown one carries the `kind` asked for,
    the config `key` it was read from (None outside a config), the `name` and the `choices`."""

    def __init__(
        self,
        message: str,
        *,
        kind: str = "",
        key: str | None = None,
        name: str | None = None,
        choices: list[str] | None = None,
    ) -> None:
        super().__init__(message)
        self.kind, self.key, self.name, self.choices = kind, key, name, sorted(choices or [])

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


def close_matches(name: str, choices: list[str], n: int = 3) -> list[str]:
    """Closest registered names to `name` (difflib ratio, cutoff 0.5)."""
    return difflib.get_close_matches(name, choices, n=n, cutoff=0.5)


def did_you_mean(name: str, choices: list[str]) -> str:
    """`; did you mean 'a' or 'b'?` for the names close to `name`, else ""."""
    near = close_matches(str(name), choices)
    return f"; did you mean {' or '.join(repr(m) for m in near)}?" if near else ""


def unknown_name_message(kind: str, name: str, choices: list[str], key: str | None = None) -> str:
    """The one error text for an unknown name: what, where, registered names, close matches."""
    where = f" (config key `{key}`)" if key else ""
    msg = f"unknown {kind} {name!r}{where}; registered: {', '.join(sorted(choices))}"
    return msg + did_you_mean(name, choices)


class Registry(Generic[T]):
    """A name -> class mapping for one component kind."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Class decorator: register under `name`; a duplicate name raises."""

        def deco(obj: T) -> T:
            if name in self._entries:
                raise RegistryError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = obj
            return obj

        return deco

    def get(self, name: str, key: str | None = None) -> T:
        """The entry for `name`, or a RegistryError listing names and close matches."""
        if name not in self._entries:
            choices = list(self._entries)
            raise RegistryError(
                unknown_name_message(self.kind, name, choices, key),
                kind=self.kind,
                key=key,
                name=name,
                choices=choices,
            )
        return self._entries[name]

    def build(self, name: str, /, **kwargs: Any) -> Any:
        """Instantiate the component `name` with its own keyword arguments."""
        cls: Any = self.get(name)
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise ValueError(f"bad arguments for {self.kind} {name!r}: {exc}") from exc

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
