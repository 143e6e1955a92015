"""Compose frlab configs outside `python -m frlab` (tests, notebooks, scripts) and expand sweeps.

`compose(overrides)` gives exactly the config `python -m frlab <overrides>` would run with
(same search path and resolvers), including the `hydra` node. `sweep_jobs(cfg)` expands a
sweep preset's `hydra.sweeper.params` into the per-job override lists that Hydra's basic
sweeper launches (the cartesian product, in order), so each job can be composed and checked.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from omegaconf import DictConfig

from frlab.config.resolvers import register_resolvers
from frlab.config.searchpath import CONFIGS_DIR, register_search_path


def compose(
    overrides: Sequence[str] = (), *, config_name: str = "train", with_hydra: bool = True
) -> DictConfig:
    """The composed root config for `overrides` (a fresh Hydra context each call)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_search_path()
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIGS_DIR), version_base="1.3"):
        return hydra_compose(
            config_name=config_name, overrides=list(overrides), return_hydra_config=with_hydra
        )


def sweep_jobs(cfg: DictConfig, base: Sequence[str] = ()) -> list[list[str]]:
    """Per-job override lists of the multirun described by `cfg.hydra.sweeper.params`."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = cfg.hydra.sweeper.get("params") or {}
    texts = [f"{key}={value}" for key, value in params.items()]
    parsed = OverridesParser.create().parse_overrides(overrides=[*base, *texts])
    axes: list[list[str]] = []
    for override in parsed:
        key = override.get_key_element()
        if override.is_sweep_override():
            axes.append([f"{key}={v}" for v in override.sweep_string_iterator()])
        else:
            axes.append([f"{key}={override.get_value_element_as_str()}"])
    return [list(job) for job in itertools.product(*axes)]
