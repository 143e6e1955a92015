"""The one door through which frlab turns `_target_` config nodes into objects.

Hydra's next release wants instantiation restricted to an allowlist; frlab keeps its own
module-prefix allowlist here so that no config (an experiment file, a command-line override)
can make frlab call arbitrary code: every `_target_` in a node, nested ones included, must
start with one of `ALLOWED_PREFIXES`. Import failures are reported as `ConfigError`s that name
the key, and a missing optional environment (math, python_tool, alfworld) is reported as
"not yet implemented / not installed" instead of a bare traceback.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from frlab.config.errors import ConfigError

ALLOWED_PREFIXES: tuple[str, ...] = ("frlab.", "envs.", "lightning.", "torch.")


def iter_targets(node: Any, key: str) -> Iterator[tuple[str, str]]:
    """(full key, target) for every `_target_` in `node`, depth first."""
    if isinstance(node, DictConfig | Mapping):
        for k in node:
            child_key = f"{key}.{k}" if key else str(k)
            if k == "_target_":
                yield child_key, str(node[k])
            else:
                child = node._get_node(k) if isinstance(node, DictConfig) else node[k]
                yield from iter_targets(child, child_key)
    elif isinstance(node, ListConfig | list | tuple):
        for i, child in enumerate(node):
            yield from iter_targets(child, f"{key}[{i}]")


def check_allowed(node: Any, key: str) -> None:
    """Raise `ConfigError` for any `_target_` outside the allowlist."""
    for target_key, target in iter_targets(node, key):
        if not target.startswith(ALLOWED_PREFIXES):
            raise ConfigError(
                target_key,
                f"target {target!r} is not allowed; frlab instantiates only "
                f"{', '.join(p + '*' for p in ALLOWED_PREFIXES)}",
            )


def instantiate(node: Any, *, key: str = "", **kwargs: Any) -> Any:
    """`hydra.utils.instantiate(node, **kwargs)` after the allowlist check.

    `key` is the node's config key (e.g. `env`, `logger`), used in error messages.
    """
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate as hydra_instantiate
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(node, Mapping) and not isinstance(node, DictConfig):
        node = OmegaConf.create(dict(node))
    check_allowed(node, key)
    try:
        return hydra_instantiate(node, **kwargs)
    except InstantiationException as exc:
        raise _explain(node, key, exc) from exc
    except OmegaConfBaseException as exc:  # an interpolation that cannot be resolved here
        raise ConfigError(key or "_target_", f"cannot resolve the node: {exc}") from exc


def _explain(node: Any, key: str, exc: Exception) -> ConfigError:
    """A ConfigError naming the key; import failures read as 'not implemented/installed'."""
    target = node.get("_target_") if isinstance(node, DictConfig) else None
    where = f"{key}._target_" if key else "_target_"
    cause = exc.__cause__ or exc
    text = str(exc)
    if isinstance(cause, ImportError) or "Error locating target" in text:
        return ConfigError(
            where,
            f"{target!r} cannot be imported: not yet implemented in this checkout or its "
            f"optional extra is not installed ({cause})",
        )
    return ConfigError(where, f"building {target!r} failed: {text}")
