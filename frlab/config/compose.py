"""Compose frlab configs outside `python -m frlab` (tests, notebooks, scripts).

`compose(overrides)` gives exactly the config `python -m frlab <overrides>` would run with
(same search path, structured configs, resolvers and legacy spellings), including the `hydra`
node; a composition error is raised as the `ConfigError` the command line would print.
`group_options(group)` lists the option files of a config group.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from frlab.config.searchpath import CONFIGS_DIR, EXPERIMENTS_DIR


def setup_hydra() -> None:
    """Everything `python -m frlab` registers with Hydra and OmegaConf (idempotent)."""
    from frlab.config.resolvers import register_resolvers
    from frlab.config.searchpath import register_search_path
    from frlab.config.store import register_configs

    register_search_path()
    register_resolvers()
    register_configs()


def compose(
    overrides: Sequence[str] = (), *, config_name: str = "train", with_hydra: bool = True
) -> DictConfig:
    """The composed root config for `overrides` (a fresh Hydra context each call)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from frlab.config.declare import check_bool_overrides
    from frlab.config.hydra_errors import explain, legacy_overrides
    from frlab.config.schema import FrlabConfig

    check_bool_overrides(FrlabConfig, legacy_overrides(overrides))
    setup_hydra()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIGS_DIR), version_base="1.3"):
        try:
            return hydra_compose(
                config_name=config_name,
                overrides=legacy_overrides(overrides),
                return_hydra_config=with_hydra,
            )
        except Exception as exc:
            err = explain(exc)
            if err is None:
                raise
            raise err from exc


def group_dir(group: str) -> Path | None:
    """The folder holding the options of config group `group`, if it is one of frlab's."""
    for root in (CONFIGS_DIR, EXPERIMENTS_DIR):
        path = root / group
        if path.is_dir() and any(path.glob("*.yaml")):
            return path
    return None


def group_options(group: str) -> list[str]:
    """The option names (YAML files) of config group `group`; [] if it is not a group."""
    path = group_dir(group)
    return sorted(p.stem for p in path.glob("*.yaml")) if path else []
