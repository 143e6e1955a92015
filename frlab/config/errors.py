"""`ConfigError`, the one error type for a bad frlab configuration, and Hydra's errors as one.

A `ConfigError` names the full config key (e.g. `objective.trust_region`) and, where a name or
key was misspelt, lists the valid choices and suggests the closest ones
(`frlab.registry.close_matches`), or the keys given in `suggestions` (a key that lives
elsewhere, e.g. `rollout.sampling.temperature` for `rollout.temperature`).

With structured configs (frlab.config.schema) Hydra itself refuses an unknown key, a value of
the wrong type or an unknown group option while it composes, and `@hydra.main` would print
its own message and exit 1. `explain` turns those exceptions into a `ConfigError`;
`call_hydra_main` runs `python -m frlab`'s `@hydra.main` function with Hydra re-raising
instead of printing (HYDRA_FULL_ERROR=1) and prints such an error as `frlab: config error:
...` with exit code 2, for single runs and every job of a `-m` sweep;
`frlab.config.compose.compose` raises it. Nothing of Hydra is patched.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

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


def keyed(exc: Exception) -> ConfigError:
    """The ConfigError for a ValueError whose text starts with the config key it is about
    (`rollout.remote.servers lists a server twice: ...`), as the owners of a setting raise."""
    key, _, text = str(exc).partition(" ")
    return ConfigError(key.rstrip(":"), text)


def unknown(key: str, what: str, value: object, choices: Iterable[str]) -> ConfigError:
    """The error for an unknown name or key `value` at `key`."""
    return ConfigError(key, f"unknown {what} {value!r}", value=value, choices=choices)


# OmegaConf's typed value nodes, in words.
NODE_KINDS = {"IntegerNode": "an integer", "FloatNode": "a number", "BooleanNode": "true or false",
              "StringNode": "a string"}  # fmt: skip


def explain(exc: BaseException) -> ConfigError | None:
    """The ConfigError for a Hydra composition / override error; None for anything else."""
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
        return ConfigError("command line", str(exc).strip().splitlines()[0])
    null = re.search(r"full_key: (\S+)", str(exc)) if isinstance(exc, AttributeError) else None
    if null and "'NoneType'" in str(exc):  # OmegaConf merging a mapping into a null typed node
        key = null.group(1)
        return ConfigError(key, "is null here, and OmegaConf cannot merge a mapping into a null "
                                "typed key: set it in a config file (a preset or a group "
                                "option) instead")  # fmt: skip
    if not isinstance(exc, ConfigCompositionException):
        return None
    text = str(exc)
    where = re.match(r"In '([^']+)'", text)
    source = f" (in config '{where.group(1)}')" if where else ""
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, OmegaConfBaseException):
        return _from_omegaconf(cause, source)
    quoted = re.search(r"'([^']+)'", text)
    key = quoted.group(1) if quoted else "command line"
    if "An item is already at" in text:
        return ConfigError(key, f"exists already: set it without the +, as {key}=...")
    return ConfigError(key, text.strip().splitlines()[0] + source)


def omegaconf_error(exc: Any) -> ConfigError:
    """The ConfigError for an OmegaConf error raised outside composition (a merge)."""
    return _from_omegaconf(exc, "")


def _missing_option(exc: Any) -> ConfigError | None:
    """`objective=flashreinforse`: an unknown option of a config group."""
    found = re.search(r"Could not find '([^']+)'", str(exc))
    if not found or "/" not in found.group(1):
        return None
    group, _, value = found.group(1).rpartition("/")
    options = [o for o in (getattr(exc, "options", None) or []) if not o.startswith("_")]
    return ConfigError(
        group.replace("/", "."),
        f"unknown option {value!r} of config group `{group}`",
        value=value,
        choices=options or None,
    )


def _from_omegaconf(cause: Any, source: str) -> ConfigError:
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ConfigTypeError

    key = str(getattr(cause, "full_key", "") or "")
    msg = str(getattr(cause, "msg", "") or cause).strip().splitlines()[0]
    parent = getattr(cause, "parent_node", None)
    root = _root_values(parent)
    if isinstance(cause, ConfigAttributeError | ConfigKeyError) and key:
        head = key.rsplit(".", 1)[0] if "." in key else ""
        if head and not _keys(parent) and _declared_empty(head):  # each key is a new one
            return ConfigError(key, f"`{head}` is empty: add the key with +{key}=...")
        if head and not _keys(parent):  # the parent is null here
            return ConfigError(key, f"`{head}` has no keys here: {_null_hint(head)}")
        open_node = not _typed(parent)  # env, callbacks, eval: new keys are added with +
        return unknown_key(key, _keys(parent), root, _refused(parent, key),
                           f"to add a new key write +{key}=..." if open_node else "")  # fmt: skip
    if isinstance(cause, ConfigTypeError) and "deletion" in msg:
        return ConfigError(key, "is a declared key and cannot be removed (~): set a value")
    typed = re.search(r"(\w+) is not a subclass of (\w+)\. value: (.*)", msg)
    if typed:
        return _wrong_node(key, typed.group(2), typed.group(3).strip(), source)
    null = "Incompatible value 'None'" in msg
    if null or "is not Optional" in msg or "cannot be assigned None" in msg:
        return ConfigError(key, f"must be set ({_node_kind(parent, key)}), got null")
    value = re.match(r"Value '(.*)' (?:of type|is not)", msg)
    if value and key:
        shown = value.group(1)
        return ConfigError(key, f"must be {_node_kind(parent, key)}, got {shown!r}")
    return ConfigError(key or "config", msg + source)


def _wrong_node(key: str, cls_name: str, value: str, source: str) -> ConfigError:
    """A plain value where a declared section (or an engine node) belongs."""
    from frlab.config.engines import ENGINES

    if cls_name in {cls.__name__ for cls in ENGINES.values()}:
        return engine_named(value, source)
    return ConfigError(key or "config", f"must be a mapping of {cls_name} keys, got {value!r}")


def engine_named(name: str, source: str = "") -> ConfigError:
    """The engine written as a name where its config group belongs (a preset's `engine: vllm`)."""
    return ConfigError(
        "rollout.engine",
        f"{name!r} is a name, but the engine is the config group rollout/engine: write "
        f"rollout/engine={name} on the command line, or `- override /rollout/engine: "
        f"{name}` in a preset's defaults list{source}",
    )


def _null_hint(head: str) -> str:
    if head == "rollout.remote":
        return "select the fleet with rollout=remote"
    return f"set the whole mapping, e.g. {head}={{name: value}}"


def _root(node: Any) -> Any:
    return node._get_root() if node is not None else None


def _root_values(node: Any) -> dict[str, Any]:
    """The composed config as plain containers, interpolations left as written."""
    from omegaconf import DictConfig, OmegaConf

    root = _root(node)
    if not isinstance(root, DictConfig):
        return {}
    return OmegaConf.to_container(root, resolve=False)  # type: ignore[return-value]


def _declared_empty(key: str) -> bool:
    """Whether dotted `key` is declared with an empty mapping as its default."""
    from frlab.config.declare import declared_field, default_of
    from frlab.config.schema import FrlabConfig

    found = declared_field(FrlabConfig, key)
    return found is not None and default_of(found[0]) == {}


def _keys(node: Any) -> list[str]:
    from omegaconf import DictConfig

    if isinstance(node, DictConfig) and not node._is_none() and not node._is_missing():
        return [str(k) for k in node.keys()]
    return []


def _typed(node: Any) -> bool:
    from omegaconf import OmegaConf

    try:
        return OmegaConf.get_type(node) not in (dict, None)
    except Exception:  # a None or missing node
        return False


def _refused(node: Any, key: str) -> str | None:
    from omegaconf import OmegaConf

    try:
        refused = getattr(OmegaConf.get_type(node), "REFUSED", {})
    except Exception:
        return None
    return refused.get(key.rsplit(".", 1)[-1])


def _node_kind(parent: Any, key: str) -> str:
    """The declared kind of `key` in words (from the typed node holding it)."""
    try:
        node = parent._get_node(key.rsplit(".", 1)[-1])
    except Exception:
        return "a value"
    return NODE_KINDS.get(type(node).__name__, "a value")


def unknown_key(
    full: str, siblings: list[str], root: Mapping[str, Any], why: str | None, hint: str = ""
) -> ConfigError:
    """The error for a key that is not declared. Suggested: the same name elsewhere in the
    same top-level section (`rollout.temperature` -> `rollout.sampling.temperature`), else
    the closest sibling names."""
    name = full.rsplit(".", 1)[-1]
    if why:
        return ConfigError(full, f"frlab sets this itself: {why}")
    section = root.get(full.split(".", 1)[0])
    moved = []
    if isinstance(section, Mapping) and "." in full:
        moved = [k for k in _leaf_keys(section, full.split(".", 1)[0])
                 if k.rsplit(".", 1)[-1] == name and k != full]  # fmt: skip
    text = f"unknown key {name!r}" + (f" ({hint})" if hint else "")
    return ConfigError(full, text, value=name, choices=siblings, suggestions=moved or None)


def _leaf_keys(values: Mapping[str, Any], prefix: str) -> list[str]:
    """Full keys of every value below `values` (depth first)."""
    out: list[str] = []
    for name, value in values.items():
        full = f"{prefix}.{name}"
        out.append(full)
        if isinstance(value, Mapping):
            out += _leaf_keys(value, full)
    return out


def call_hydra_main(hydra_main: Callable[[], Any]) -> None:
    """Call a `@hydra.main` function; a config error is printed as `frlab: config error: ...`
    and exits 2.

    Hydra (hydra-core 1.3) reports an exception raised while it composes the config or runs a
    job by printing it and exiting 1, unless the environment variable HYDRA_FULL_ERROR=1 asks
    it to re-raise the exception as it is. frlab sets that variable, so every composition
    error (single runs and each job of a `-m` sweep) reaches `explain` here. Other exceptions
    exit 1: with a full traceback, or, for Hydra's own short errors (a missing primary config
    or `--config-dir`), Hydra's one message unless HYDRA_FULL_ERROR=1 was set by the user.
    """
    from hydra.errors import CompactHydraException
    from omegaconf.errors import OmegaConfBaseException

    user_setting = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        hydra_main()
    except Exception as exc:
        err = explain(exc)
        if err is not None:
            print(f"frlab: config error: {err}", file=sys.stderr, flush=True)
            sys.exit(2)
        if user_setting == "1" or not isinstance(exc, CompactHydraException):
            raise
        print(exc, file=sys.stderr, flush=True)
        if isinstance(exc.__cause__, OmegaConfBaseException):
            print(exc.__cause__, file=sys.stderr, flush=True)
        print("\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
              file=sys.stderr, flush=True)  # fmt: skip
        sys.exit(1)
    finally:  # the user's setting again, for whatever runs after (a test's next call)
        if user_setting is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = user_setting
