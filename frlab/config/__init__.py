"""frlab's configuration: each key declared once, Hydra composes, preflight checks, a plan.

Layered one way, each module importing only those above it: `errors` (`ConfigError`, Hydra's
errors with close matches) < `declare` (`spec`: ranges, choices, `arg=False`) < `schema`
(every key, the engine, fleet and eval nodes included) < `compose` (what frlab registers with
Hydra, `compose`, `instantiate`) < `plan` (the facts a dry run prints and a run records) <
`preflight` (the rules between keys; engines and evaluations check their own nodes).
Importing the package is light (no torch, no transformers).
"""

from frlab.config.errors import ConfigError

__all__ = ["ConfigError"]
