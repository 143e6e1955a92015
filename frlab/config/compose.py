"""Everything frlab registers with Hydra, `compose`, Hydra's errors at the command line, and the
one door from a `_target_` node to an object.

- The declarations (frlab.config.schema) go into Hydra's ConfigStore under root-level names, not
  in a config group, so `--help` lists only frlab's groups: `frlab_root` (first in
  `configs/train.yaml`'s defaults list), `frlab_fleet`, `frlab_engine_NAME` and `frlab_eval_KIND`
  (the eval node's defaults as a plain mapping, so a benchmark set can be replaced). Group
  option files pull them in with `defaults: [/frlab_engine_torch@_here_]`.
- `experiments/` (the `experiment/` and `sweep/` groups) joins Hydra's search path through a
  `SearchPathPlugin` registered in-process, so `experiment=NAME` works from any folder.
- Two resolvers name run folders: a single run's ends in `_` and 6 hex digits of the overrides'
  SHA-1 (`frlab_suffix`); a sweep job's is its overrides when short, else `job<N>_<hash>`.
- `call_hydra_main` runs `@hydra.main` with Hydra re-raising (HYDRA_FULL_ERROR=1, its documented
  switch) and prints a composition error as `frlab: config error: ...`, exit 2.
- `instantiate` is `hydra.utils.instantiate` that names the node's key when it fails.
"""

from __future__ import annotations

import copy
import hashlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import DictConfig, OmegaConf

from frlab.config import schema
from frlab.config.declare import declared, not_args, section_type
from frlab.config.errors import ConfigError, first_line, from_hydra

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS_DIR = REPO_ROOT / "configs"
EXPERIMENTS_DIR = REPO_ROOT / "experiments"
MAX_NAME = 80  # longest sweep-job folder named by its overrides


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


def setup_hydra() -> None:
    """Everything `python -m frlab` registers with Hydra and OmegaConf (idempotent: the
    declarations are stored again only when the engine or evaluation registries changed)."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins

    global _STORED
    Plugins.instance().register(FrlabSearchPathPlugin)
    for name, fn in (("frlab_suffix", run_suffix), ("frlab_subdir", sweep_subdir)):
        OmegaConf.register_new_resolver(name, fn, replace=True)
    registries = _registries()
    if registries == _STORED:
        return
    store = ConfigStore.instance()
    store.store(name="frlab_root", node=schema.FrlabConfig)
    store.store(name="frlab_fleet", node=schema.RemoteConfig)
    for name, cls in schema.ENGINES.items():
        store.store(name=f"frlab_engine_{name}", node=cls)
    for kind, cls in schema.EVALS.items():
        plain = OmegaConf.to_container(OmegaConf.structured(cls), resolve=False)
        store.store(name=f"frlab_eval_{kind}", node=plain)
    _STORED = registries


_STORED: tuple | None = None  # the registries last stored in Hydra's ConfigStore
_COMPOSED: dict[tuple, DictConfig] = {}  # compose's memo (see `compose`)
MAX_COMPOSED = 256


def _registries() -> tuple:
    """What `setup_hydra` stores: the declaration classes by name."""
    return (
        schema.FrlabConfig,
        schema.RemoteConfig,
        tuple(schema.ENGINES.items()),
        tuple(schema.EVALS.items()),
    )


def _config_files() -> tuple:
    """Every YAML file compose can read, with its size and modification time (not the run
    records in `.hydra/` folders of committed runs: never a config group)."""
    return tuple(
        (str(path), stat.st_mtime_ns, stat.st_size)
        for root in (CONFIGS_DIR, EXPERIMENTS_DIR)
        for path in sorted(root.rglob("*.yaml"))
        if ".hydra" not in path.parts
        for stat in (path.stat(),)
    )


def compose(
    overrides: Sequence[str] = (), *, config_name: str = "train", with_hydra: bool = True
) -> DictConfig:
    """The config `python -m frlab <overrides>` runs with; a composition error is raised as the
    ConfigError the command line prints. A fresh copy each call: the same call again in one
    process (same overrides, working folder, config files and registries) copies the config
    composed the first time instead of composing it again (about 20x faster)."""
    setup_hydra()  # sets _STORED: the registries the store now holds
    key = (config_name, tuple(overrides), with_hydra, os.getcwd(), _config_files(), _STORED)
    composed = _COMPOSED.get(key)
    if composed is None:
        composed = _compose(overrides, config_name=config_name, with_hydra=with_hydra)
        if len(_COMPOSED) >= MAX_COMPOSED:
            _COMPOSED.pop(next(iter(_COMPOSED)))
        _COMPOSED[key] = composed
    return copy.deepcopy(composed)


def _compose(overrides: Sequence[str], *, config_name: str, with_hydra: bool) -> DictConfig:
    """Hydra's compose in a fresh Hydra context."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIGS_DIR), version_base="1.3"):
        try:
            return hydra_compose(
                config_name=config_name, overrides=list(overrides), return_hydra_config=with_hydra
            )
        except Exception as exc:
            err = explain(exc)
            if err is None:
                raise
            raise err from exc


def explain(exc: BaseException) -> ConfigError | None:
    """`from_hydra`'s ConfigError (None: not a composition error), see `suggest_moved`."""
    err = from_hydra(exc)
    return None if err is None else suggest_moved(err)


def suggest_moved(err: ConfigError) -> ConfigError:
    """For an unknown key declared under the same name elsewhere in its section
    (`rollout.temperature`), that key as the suggestion; else `err` as it is."""
    if err.choices is None or "." not in err.key:
        return err
    section, _, rest = err.key.partition(".")
    name = rest.rsplit(".", 1)[-1]
    moved = [
        k
        for k in declared_keys(schema.FrlabConfig, "")
        if k.startswith(f"{section}.") and k.rsplit(".", 1)[-1] == name and k != err.key
    ]
    if not moved:
        return err
    return ConfigError(err.key, err.reason, choices=err.choices, suggestions=moved)


def declared_keys(cls: type, prefix: str) -> list[str]:
    """Full keys of every declaration below `cls`, nested sections included."""
    out = []
    for f, annotation in declared(cls):
        full = f"{prefix}.{f.name}" if prefix else f.name
        sub = section_type(annotation)
        out += [full, *(declared_keys(sub, full) if sub is not None else [])]
    return out


def call_hydra_main(hydra_main: Callable[[], Any]) -> None:
    """Call a `@hydra.main` function; a config error is printed as `frlab: config error: ...`
    and exits 2.

    Hydra (1.3) prints an exception raised while it composes or runs a job and exits 1, unless
    HYDRA_FULL_ERROR=1 asks it to re-raise: frlab sets that variable, so a composition error of a
    single run or of any job of a `-m` sweep reaches `explain` here. Other exceptions exit 1: with
    a traceback, or, for Hydra's own short errors (a missing `--config-dir`), Hydra's message
    unless the user set HYDRA_FULL_ERROR=1."""
    from hydra.errors import CompactHydraException
    from omegaconf.errors import OmegaConfBaseException

    user_setting = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        hydra_main()
    except Exception as exc:
        err = explain(exc)
        if err is not None:
            print(f"frlab: config error: {err}", file=sys.stderr, flush=True)
            sys.exit(2)
        if user_setting == "1" or not isinstance(exc, CompactHydraException):
            raise
        print(exc, file=sys.stderr, flush=True)
        if isinstance(exc.__cause__, OmegaConfBaseException):
            print(exc.__cause__, file=sys.stderr, flush=True)
        print(
            "\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(1)
    finally:  # the user's setting again, for whatever runs after (a test's next call)
        if user_setting is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = user_setting


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


def instantiate(node: Any, *, key: str, **kwargs: Any) -> Any:
    """`hydra.utils.instantiate(node, **kwargs)` for the node at config key `key`: containers
    reach the target as plain dicts and lists, and the keys its declaration marks `arg=False`
    (read by frlab itself) are left out. Hydra's error is a ConfigError naming `KEY._target_`
    (the target's own ConfigError passes through)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate as hydra_instantiate
    from omegaconf.errors import OmegaConfBaseException

    kwargs.setdefault("_convert_", "all")
    try:
        return hydra_instantiate(_arguments(node), **kwargs)
    except InstantiationException as exc:
        if isinstance(exc.__cause__, ConfigError):  # the target named its own key
            raise exc.__cause__ from None
        raise ConfigError(f"{key}._target_", " ".join(str(exc).split())) from exc
    except OmegaConfBaseException as exc:  # an interpolation that cannot be resolved here
        raise ConfigError(key, first_line(exc)) from exc


def _arguments(node: Any) -> Any:
    """The node without the keys its declaration marks `arg=False` (resolved, a new node)."""
    if isinstance(node, Mapping) and not isinstance(node, DictConfig):
        node = OmegaConf.create(dict(node))
    target = str(node.get("_target_", "")) if isinstance(node, DictConfig) else ""
    found = schema.declaration_of(target)
    cls = found[1] if found is not None else None
    drop = not_args(cls) if cls is not None else ()
    if not drop:
        return node
    values: dict[str, Any] = OmegaConf.to_container(node, resolve=True)  # type: ignore[assignment]
    return OmegaConf.create({k: v for k, v in values.items() if k not in drop})


def locate(target: str) -> Any:
    """The object a `_target_` names (`hydra.utils.get_object`), without Hydra's ERROR log
    when it cannot be imported: the callers here treat that as "not on this machine"."""
    import logging

    from hydra.utils import get_object

    hydra_log = logging.getLogger("hydra.utils")
    disabled, hydra_log.disabled = hydra_log.disabled, True
    try:
        return get_object(target)
    finally:
        hydra_log.disabled = disabled
