"""frlab's configuration system: declarations, Hydra configs, preflight, the run plan.

Each key is declared once in `frlab.config.schema` (structured configs, registered by
`frlab.config.store`); import from the submodules: `frlab.config.preflight.preflight(cfg) ->
Plan`, `frlab.config.instantiate.instantiate(node, **kw)`,
`frlab.config.compose.compose(overrides)`. Importing the package is light (no torch, no
transformers).
"""

from frlab.config.errors import ConfigError

__all__ = ["ConfigError"]
