"""frlab's configuration system: Hydra configs, preflight validation, the run plan.

Import from the submodules: `frlab.config.preflight.preflight(cfg) -> Plan`,
`frlab.config.instantiate.instantiate(node, **kw)`, `frlab.config.compose.compose(overrides)`.
Importing the package is light (no torch, no transformers).
"""

from frlab.config.errors import ConfigError

__all__ = ["ConfigError"]
