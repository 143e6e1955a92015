"""Registers frlab's declarations (frlab.config.schema) with Hydra's ConfigStore.

- `frlab_root`: the root `FrlabConfig`, first in `configs/train.yaml`'s defaults list;
- `frlab_schema/rollout/remote`: the typed `rollout.remote` block (`rollout=remote`);
- `frlab_schema/rollout/engine/NAME`: the typed engine nodes of `rollout/engine=NAME`;
- `frlab_schema/eval/KIND`: the defaults of an `eval` node of kind math | episodes, as a plain
  mapping (the eval node stays untyped: frlab.config.schema_eval says why).

Group option files pull these in with `defaults: [/frlab_schema/...@_here_]`, so a YAML file
holds only what differs from the declared defaults.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from frlab.config.schema import ENGINES, FrlabConfig, RemoteConfig
from frlab.config.schema_eval import EVALS


def register_configs() -> None:
    """Store every declaration (idempotent: storing again replaces the same entries)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="frlab_root", node=FrlabConfig)
    cs.store(group="frlab_schema/rollout", name="remote", node=RemoteConfig)
    for name, cls in ENGINES.items():
        cs.store(group="frlab_schema/rollout/engine", name=name, node=cls)
    for kind, cls in EVALS.items():
        plain = OmegaConf.to_container(OmegaConf.structured(cls), resolve=False)
        cs.store(group="frlab_schema/eval", name=kind, node=plain)
