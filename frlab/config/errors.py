"""Hydra's and OmegaConf's errors as frlab's one `ConfigError` (frlab.errors).

A `ConfigError` names the full config key (e.g. `objective.trust_region`) and, where a name or
key was misspelt, suggests the closest valid ones (`frlab.registry.close_matches`) and lists
the valid options. Hydra and OmegaConf name the key of a composition error themselves:
`from_hydra` keeps their words and adds only what they lack, the close matches of a misspelt
key or group option, the valid options, and the reason frlab sets a key itself (a declared
section's `REFUSED`). Imports nothing of frlab.config: every module there stands on it.
"""

from __future__ import annotations

import re
from typing import Any

from frlab.errors import ConfigError


def first_line(exc: object) -> str:
    """The first line of an error's text (Hydra and OmegaConf append their context below)."""
    return (str(exc).strip().splitlines() or [""])[0].strip()


def from_hydra(exc: BaseException) -> ConfigError | None:
    """The ConfigError for an error Hydra raises while it composes (None for anything else)."""
    from hydra.errors import (
        ConfigCompositionException,
        MissingConfigException,
        OverrideParseException,
    )
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(exc, ConfigError):
        return exc
    if isinstance(exc, MissingConfigException):
        return _missing_option(exc)
    if isinstance(exc, OverrideParseException):
        return ConfigError("command line", first_line(exc))
    if isinstance(exc, AttributeError) and "full_key:" in str(exc):  # OmegaConf, merging
        return from_omegaconf(exc)  # a mapping into a typed key that is null
    if not isinstance(exc, ConfigCompositionException):
        return None
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, OmegaConfBaseException):
        return from_omegaconf(cause)
    quoted = re.search(r"'([^']+)'", str(exc))  # `+KEY=...` on a key that exists: Hydra names it
    return ConfigError(quoted.group(1) if quoted else "command line", first_line(exc))


def _missing_option(exc: Any) -> ConfigError | None:
    """`objective=flashreinforse`: an unknown option of a config group."""
    found = re.search(r"Could not find '([^']+)'", str(exc))
    if not found or "/" not in found.group(1):
        return None
    group, _, value = found.group(1).rpartition("/")
    options = [o for o in (getattr(exc, "options", None) or []) if not o.startswith("_")]
    text = f"Could not find {found.group(1)!r} (no option {value!r} of config group `{group}`)"
    return ConfigError(group.replace("/", "."), text, value=value, choices=options or None)


def from_omegaconf(cause: Any) -> ConfigError:
    """The ConfigError for an OmegaConf error: its key and its first line; for an unknown key,
    the close matches among the keys beside it and, where frlab sets it, the reason."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    key = str(getattr(cause, "full_key", "") or "")
    if not key:
        found = re.search(r"full_key: (\S+)", str(cause))
        key = found.group(1) if found else "config"
    text = first_line(getattr(cause, "msg", None) or cause)
    parent = getattr(cause, "parent_node", None)
    if not isinstance(cause, ConfigAttributeError | ConfigKeyError):
        return ConfigError(key, text)
    name = key.rsplit(".", 1)[-1]
    why = _refused(parent).get(name)
    if why:
        return ConfigError(key, f"{text}: frlab sets it itself ({why})")
    return ConfigError(key, text, value=name, choices=_keys(parent))


def _keys(node: Any) -> list[str] | None:
    """The keys of a mapping node (None: not a mapping, a null or an empty one)."""
    try:
        return [str(k) for k in node.keys()] or None
    except Exception:  # None, a missing node or a list
        return None


def _refused(node: Any) -> dict[str, str]:
    """The keys a declared section refuses, with the reason (its `REFUSED`)."""
    from omegaconf import OmegaConf

    try:
        return dict(getattr(OmegaConf.get_type(node), "REFUSED", {}))
    except Exception:  # a null or untyped node
        return {}
