"""frlab's configuration: each key declared once, Hydra composes, preflight checks, a plan.

- `schema` (with `schema_trainer`): every key's type, default, range and meaning, as Hydra
  structured configs; `declare`: the `spec` rules a type cannot say (ranges, choices,
  `arg=False`) and their check;
- `engines`: the engine node (`rollout/engine` options) and the fleet, declared, and what the
  chosen engine class says it supports; `evaluation`: the `eval` node, declared and checked;
- `compose`: what frlab registers with Hydra (the declarations, the `experiments/` search
  path, the run-folder resolvers, old command-line spellings) and `compose(overrides)`;
- `errors`: `ConfigError` (the key named, close matches) and Hydra's errors as one, exit 2;
- `preflight`: the rules between keys (the objective node checks itself); it returns
- `plan`: the resolved `Plan` a dry run prints and a run records;
- `instantiate`: the one door from a `_target_` node to an object (an allowlist).

Importing the package is light (no torch, no transformers).
"""

from frlab.config.errors import ConfigError

__all__ = ["ConfigError"]
