"""`ConfigError(key, reason)`: the one error for a configuration frlab refuses, naming its key.

A leaf module (it imports only frlab.registry, itself a leaf), so that every owner of a
setting, from the objective's components to the fleet client, raises it with the key as data:
nothing parses a message to find the key. It is a ValueError, so callers that catch those
still do. `python -m frlab` prints any ConfigError as `frlab: config error: ...` and exits 2.
"""

from __future__ import annotations

from collections.abc import Iterable

from frlab.registry import close_matches


class ConfigError(ValueError):
    """A configuration value, key or combination that frlab refuses, naming the key.

    `key` is the full config key (`objective.trust_region`, `rollout.remote.servers`), `reason`
    what is wrong in words. Where a name or key was misspelt, `suggestions` holds the closest
    valid ones (from `choices` and `value` when not given), and `choices` the valid options."""

    def __init__(
        self,
        key: str,
        reason: str,
        *,
        value: object = None,
        choices: Iterable[str] | None = None,
        suggestions: Iterable[str] | None = None,
    ) -> None:
        self.key, self.reason = key, reason
        self.suggestions: list[str] = list(suggestions or [])
        self.choices = sorted(str(c) for c in choices) if choices is not None else None
        if not self.suggestions and self.choices is not None and value is not None:
            self.suggestions = close_matches(str(value), self.choices)
        text = f"config key `{key}`: {reason}"
        if self.suggestions:
            text += f"; did you mean {' or '.join(repr(n) for n in self.suggestions)}?"
        if self.choices is not None:
            text += f" (valid: {', '.join(self.choices)})"
        super().__init__(text)
