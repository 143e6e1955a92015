"""The one door through which frlab turns `_target_` config nodes into objects.

A config (an experiment file, a command-line override) may name as `_target_` only

- a class or function of frlab's own packages, `frlab.` and `envs.`;
- one of the third-party classes in `ALLOWED_TARGETS` (Lightning's Trainer, loggers,
  callbacks and strategies, torch optimizers), by exact name;
- a class or function inside a package the run lists in `user_modules` (e.g.
  `user_modules=[mypkg]` admits `mypkg.envs.MyEnv`). Standard-library modules and the large
  frameworks (torch, transformers, ...) cannot be listed there: they hold functions that run
  arbitrary code (`os.system`, `torch.hub.load`, `trust_remote_code`).

So a config cannot make frlab call an arbitrary function; it can run code of the packages it
is allowed to name, which is the point of user modules. Every `_target_` of a node, nested ones
included, is checked before anything is built. Import failures are reported as `ConfigError`s
that name the key, and a missing optional environment (math, python_tool, alfworld) reads as
"not yet implemented / not installed" instead of a bare traceback. Keys a section declares
with `arg=False` (read by frlab itself, e.g. `optim.grad_clip`) are not passed to its target.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from frlab.config.errors import ConfigError

BUILTIN_PREFIXES: tuple[str, ...] = ("frlab.", "envs.")
ALLOWED_TARGETS: frozenset[str] = frozenset(
    {
        "lightning.Trainer",
        "lightning.pytorch.Trainer",
        *(f"lightning.pytorch.loggers.{n}" for n in (
            "CSVLogger", "TensorBoardLogger", "WandbLogger", "MLFlowLogger", "CometLogger",
            "NeptuneLogger")),
        *(f"lightning.pytorch.callbacks.{n}" for n in (
            "ModelCheckpoint", "LearningRateMonitor", "EarlyStopping", "Timer",
            "TQDMProgressBar", "RichProgressBar", "RichModelSummary", "ModelSummary",
            "DeviceStatsMonitor", "GradientAccumulationScheduler")),
        *(f"lightning.pytorch.strategies.{n}" for n in (
            "DDPStrategy", "FSDPStrategy", "ModelParallelStrategy", "SingleDeviceStrategy")),
        *(f"torch.optim.{n}" for n in ("AdamW", "Adam", "SGD", "RMSprop", "Adagrad")),
    }
)  # fmt: skip
# Top-level packages that cannot be listed in `user_modules` (besides the standard library).
FRAMEWORKS = frozenset({
    "torch", "lightning", "pytorch_lightning", "transformers", "huggingface_hub", "hydra",
    "omegaconf", "numpy", "scipy", "pandas", "datasets", "vllm", "accelerate", "safetensors",
    "tokenizers", "wandb", "tensorboard", "httpx", "requests", "pip", "setuptools", "pkg_resources",
    "yaml", "dill", "cloudpickle", "joblib", "IPython", "frlab", "envs",
})  # fmt: skip


def check_user_modules(names: Iterable[Any]) -> tuple[str, ...]:
    """The `user_modules` entries as target prefixes (`mypkg` -> `mypkg.`); refuses the
    standard library and the frameworks, whose functions would run arbitrary code."""
    prefixes = []
    for i, name in enumerate(names):
        key = f"user_modules[{i}]"
        text = str(name).strip().rstrip(".")
        if (
            not isinstance(name, str)
            or not text
            or not all(part.isidentifier() for part in text.split("."))
        ):
            raise ConfigError(key, f"must be a Python package name like mypkg, got {name!r}")
        top = text.split(".")[0]
        if top in sys.stdlib_module_names or top in FRAMEWORKS or top == "builtins":
            raise ConfigError(
                key,
                f"{top!r} is the standard library or a framework frlab uses: configs may not "
                "call into it (it holds functions that run arbitrary code); list your own "
                "package",
            )
        prefixes.append(text + ".")
    return tuple(prefixes)


def allowed(target: str, user_modules: tuple[str, ...] = ()) -> bool:
    return target in ALLOWED_TARGETS or target.startswith(BUILTIN_PREFIXES + user_modules)


def iter_targets(node: Any, key: str) -> Iterator[tuple[str, str]]:
    """(full key, target) for every `_target_` in `node`, depth first."""
    if isinstance(node, DictConfig | Mapping):
        for k in node:
            child_key = f"{key}.{k}" if key else str(k)
            if k == "_target_":
                yield child_key, str(node[k])
            else:
                child = node._get_node(k) if isinstance(node, DictConfig) else node[k]
                yield from iter_targets(child, child_key)
    elif isinstance(node, ListConfig | list | tuple):
        for i, child in enumerate(node):
            yield from iter_targets(child, f"{key}[{i}]")


def check_allowed(node: Any, key: str, user_modules: tuple[str, ...] = ()) -> None:
    """Raise `ConfigError` for any `_target_` outside the allowlist."""
    for target_key, target in iter_targets(node, key):
        if not allowed(target, user_modules):
            mine = ", ".join(p + "*" for p in BUILTIN_PREFIXES + user_modules)
            raise ConfigError(
                target_key,
                f"target {target!r} is not allowed; frlab instantiates {mine} and the listed "
                "Lightning and torch.optim classes; add your own package with "
                "user_modules=[PACKAGE]",
            )


def instantiate(
    node: Any, *, key: str = "", user_modules: Iterable[str] = (), **kwargs: Any
) -> Any:
    """`hydra.utils.instantiate(node, **kwargs)` after the allowlist check.

    `key` is the node's config key (e.g. `env`, `logger`), used in error messages;
    `user_modules` the run's `user_modules`. Containers reach the target as plain
    dicts/lists, and keys its declaration marks `arg=False` are left out.
    """
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate as hydra_instantiate
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(node, Mapping) and not isinstance(node, DictConfig):
        node = OmegaConf.create(dict(node))
    check_allowed(node, key, check_user_modules(user_modules))
    node = _without_frlab_keys(node)
    kwargs.setdefault("_convert_", "all")
    try:
        return hydra_instantiate(node, **kwargs)
    except InstantiationException as exc:
        raise _explain(node, key, exc) from exc
    except OmegaConfBaseException as exc:  # an interpolation that cannot be resolved here
        raise ConfigError(key or "_target_", f"cannot resolve the node: {exc}") from exc


def _without_frlab_keys(node: Any) -> Any:
    """The node without the keys its declaration marks `arg=False` (resolved, as a new node);
    unchanged when its `_target_` has no declaration or drops nothing."""
    from frlab.config.declare import not_args
    from frlab.config.schema import declaration_for

    if not isinstance(node, DictConfig):
        return node
    cls = declaration_for(str(node.get("_target_", "")))
    drop = not_args(cls) if cls is not None else ()
    if not drop:
        return node
    values = OmegaConf.to_container(node, resolve=True)
    return OmegaConf.create({k: v for k, v in values.items() if k not in drop})  # type: ignore[union-attr]


def _explain(node: Any, key: str, exc: Exception) -> ConfigError:
    """A ConfigError naming the key; import failures read as 'not implemented/installed'."""
    target = node.get("_target_") if isinstance(node, DictConfig) else None
    where = f"{key}._target_" if key else "_target_"
    cause = exc.__cause__ or exc
    if isinstance(cause, ConfigError):
        return cause
    text = str(exc)
    refused = re.search(r"unexpected keyword argument '(\w+)'", str(cause))
    name = refused.group(1) if refused and isinstance(cause, TypeError) else None
    accepted = accepted_arguments(str(target)) if name and target else []
    if name in node and accepted and name not in accepted:  # this node's own key (not nested)
        return ConfigError(f"{key}.{name}" if key else name, f"unknown argument {name!r} of "
                           f"{target}", value=name, choices=accepted)  # fmt: skip
    if isinstance(cause, ImportError) or "Error locating target" in text:
        return ConfigError(
            where,
            f"{target!r} cannot be imported: not yet implemented in this checkout or its "
            f"optional extra is not installed ({cause})",
        )
    return ConfigError(where, f"building {target!r} failed: {text}")


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


def accepted_arguments(target: str) -> list[str]:
    """The keyword arguments `target` takes, following `**kwargs` handed on to a base class's
    `__init__` (a subclass that only adds behaviour); [] when they cannot be read."""
    import inspect

    try:
        owner = locate(target)
    except Exception:  # noqa: BLE001 - only used to suggest names
        return []
    callables = (
        [c.__init__ for c in owner.__mro__ if "__init__" in vars(c)]
        if inspect.isclass(owner)
        else [owner]
    )
    names: list[str] = []
    for fn in callables:
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            break
        names += [p.name for p in params
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"]  # fmt: skip
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return sorted(set(names))
