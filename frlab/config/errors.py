"""`ConfigError`: the one error type for a bad frlab configuration.

It names the full config key (e.g. `objective.trust_region`) and, where a name or key was
misspelt, lists the valid choices and suggests the closest ones
(`frlab.registry.close_matches`), or the keys given in `suggestions` (a key that lives
elsewhere, e.g. `rollout.sampling.temperature` for `rollout.temperature`).
"""

from __future__ import annotations

from collections.abc import Iterable

from frlab.registry import close_matches


class ConfigError(ValueError):
    """A configuration value, key or combination that frlab refuses, naming the key."""

    def __init__(
        self,
        key: str,
        message: str,
        *,
        value: object = None,
        choices: Iterable[str] | None = None,
        suggestions: Iterable[str] | None = None,
    ) -> None:
        self.key = key
        self.suggestions: list[str] = list(suggestions or [])
        text = f"config key `{key}`: {message}"
        names = sorted(str(c) for c in choices) if choices is not None else None
        if not self.suggestions and names is not None and value is not None:
            self.suggestions = close_matches(str(value), names)
        if self.suggestions:
            text += f"; did you mean {' or '.join(repr(n) for n in self.suggestions)}?"
        if names is not None:
            text += f" (valid: {', '.join(names)})"
        super().__init__(text)


def unknown(key: str, what: str, value: object, choices: Iterable[str]) -> ConfigError:
    """The error for an unknown name or key `value` at `key`."""
    return ConfigError(key, f"unknown {what} {value!r}", value=value, choices=choices)
