"""Everything frlab registers with Hydra, and `compose` for use outside `python -m frlab`.

- The declarations (frlab.config.schema) go into Hydra's ConfigStore: `frlab_root` (the root
  `FrlabConfig`, first in `configs/train.yaml`'s defaults list), `frlab_schema/rollout/remote`,
  `frlab_schema/rollout/engine/NAME` and `frlab_schema/eval/KIND` (the eval node's defaults as
  a plain mapping: frlab.config.evaluation says why). Group option files pull these in with
  `defaults: [/frlab_schema/...@_here_]`, so a YAML file holds only what differs.
- `experiments/` (the `experiment/` and `sweep/` groups) is appended to Hydra's search path by
  a `SearchPathPlugin` registered in-process, so `experiment=NAME` works from any working
  directory, with `hydra.compose` in tests and in jobs that re-import `frlab.__main__`.
- Two resolvers name run folders: a single run's is `<log_dir>/runs/<experiment>/<date>_<time>`
  plus `_` and 6 hex digits of the overrides' SHA-1 (`frlab_suffix`; the overrides themselves
  are in `.hydra/overrides.yaml`); a sweep job's is named by its overrides when short, else
  `job<N>_<hash>` (`frlab_subdir`). Path separators are replaced, so no nested folders.

- `legacy_overrides` keeps old command-line spellings working: `rollout.engine=NAME` (a plain
  key before the engine became a config group) means `rollout/engine=NAME`, and
  `+trainer.KEY=V` / `eval.benchmarks=[...]` are rewritten as Hydra needs them.

`compose(overrides)` gives exactly the config `python -m frlab <overrides>` would run with
(legacy spellings included), with the `hydra` node; a composition error is raised as the
`ConfigError` the command line would print. `group_options(group)` lists a group's options.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import DictConfig, OmegaConf

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS_DIR = REPO_ROOT / "configs"
EXPERIMENTS_DIR = REPO_ROOT / "experiments"
MAX_NAME = 80  # longest sweep-job folder named by its overrides
# old key -> config group, for command-line overrides `KEY=VALUE` (also `-m` sweeps).
LEGACY_GROUP_KEYS = {"rollout.engine": "rollout/engine"}
BENCHMARKS = "eval.benchmarks"


def legacy_overrides(args: Sequence[str]) -> list[str]:
    """`rollout.engine=vllm` -> `rollout/engine=vllm`; `+trainer.KEY=V` (needed before every
    Lightning argument was declared) -> `++trainer.KEY=V` for a declared KEY;
    `eval.benchmarks=[...]` (a list replaces the benchmark set, frlab.evaluation.benchmarks) ->
    `~eval.benchmarks +eval.benchmarks=[...]`, since Hydra cannot merge a list into the
    mapping of an eval group file; every other argument unchanged."""
    import dataclasses

    from frlab.config.schema_trainer import TrainerConfig

    declared = {f"+trainer.{f.name}" for f in dataclasses.fields(TrainerConfig)}
    out = []
    for arg in args:
        key, sep, value = arg.partition("=")
        if sep and key in LEGACY_GROUP_KEYS:
            arg = f"{LEGACY_GROUP_KEYS[key]}={value}"
        elif sep and key in declared:
            arg = f"+{arg}"
        elif sep and key == BENCHMARKS and value.lstrip().startswith("["):
            out.append(f"~{BENCHMARKS}")
            arg = f"+{arg}"
        out.append(arg)
    return out


class FrlabSearchPathPlugin(SearchPathPlugin):
    """Appends `experiments/` (experiment and sweep presets) to Hydra's config search path."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="frlab-experiments", path=f"file://{EXPERIMENTS_DIR}")


def safe_name(text: str) -> str:
    """A single path component: separators replaced."""
    return str(text).replace("/", "_").replace("\\", "_").strip()


def short_hash(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:6]


def run_suffix(override_dirname: str) -> str:
    """`_<hash of the overrides>`, or "" without overrides."""
    return f"_{short_hash(override_dirname)}" if override_dirname.strip() else ""


def sweep_subdir(job_num: object, override_dirname: str) -> str:
    """A sweep job's folder: its overrides when short, else `job<N>_<hash>`."""
    name = safe_name(override_dirname)
    if not name:
        return f"job{job_num}"
    return name if len(name) <= MAX_NAME else f"job{job_num}_{short_hash(override_dirname)}"


def register_configs() -> None:
    """Store every declaration (storing again replaces the same entries)."""
    from hydra.core.config_store import ConfigStore

    from frlab.config.engines import ENGINES, RemoteConfig
    from frlab.config.evaluation import EVALS
    from frlab.config.schema import FrlabConfig

    cs = ConfigStore.instance()
    cs.store(name="frlab_root", node=FrlabConfig)
    cs.store(group="frlab_schema/rollout", name="remote", node=RemoteConfig)
    for name, cls in ENGINES.items():
        cs.store(group="frlab_schema/rollout/engine", name=name, node=cls)
    for kind, cls in EVALS.items():
        plain = OmegaConf.to_container(OmegaConf.structured(cls), resolve=False)
        cs.store(group="frlab_schema/eval", name=kind, node=plain)


def setup_hydra() -> None:
    """Everything `python -m frlab` registers with Hydra and OmegaConf (idempotent)."""
    from hydra.core.plugins import Plugins

    Plugins.instance().register(FrlabSearchPathPlugin)
    for name, fn in (("frlab_suffix", run_suffix), ("frlab_subdir", sweep_subdir)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
    register_configs()


def compose(
    overrides: Sequence[str] = (), *, config_name: str = "train", with_hydra: bool = True
) -> DictConfig:
    """The composed root config for `overrides` (a fresh Hydra context each call)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from frlab.config.declare import check_bool_overrides
    from frlab.config.engines import TYPED_NODES
    from frlab.config.errors import explain
    from frlab.config.schema import FrlabConfig

    check_bool_overrides(FrlabConfig, legacy_overrides(overrides), TYPED_NODES)
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
