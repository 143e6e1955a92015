"""Where frlab's Hydra configs live, and the search-path plugin that adds `experiments/`.

`configs/` is the primary config directory (`@hydra.main(config_path="../configs")`).
`experiments/` holds the `experiment/` and `sweep/` groups; it is appended to Hydra's search
path by a `SearchPathPlugin` registered in-process (no `hydra_plugins` package needed), so
`experiment=NAME` and `sweep=NAME` work from any working directory, with an editable install,
with `hydra.compose` in tests, and inside jobs launched by hydra-submitit-launcher (they
re-import `frlab.__main__`, which registers the plugin).
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.plugins import Plugins
from hydra.plugins.search_path_plugin import SearchPathPlugin

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS_DIR = REPO_ROOT / "configs"
EXPERIMENTS_DIR = REPO_ROOT / "experiments"


class FrlabSearchPathPlugin(SearchPathPlugin):
    """Appends `experiments/` (experiment and sweep presets) to Hydra's config search path."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="frlab-experiments", path=f"file://{EXPERIMENTS_DIR}")


def register_search_path() -> None:
    """Register the plugin once per process (idempotent)."""
    Plugins.instance().register(FrlabSearchPathPlugin)
