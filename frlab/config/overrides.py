"""Friendly checks of command-line overrides before Hydra composes anything.

Hydra reports an unknown group option or key without suggesting the intended name. This
module checks `group=option` choices (every value of a comma sweep too) against the option
files of `configs/` and `experiments/`, and dotted `key=value` overrides against the composed
config, raising `ConfigError` with close matches (e.g. `rollout.max_inflight` -> did you mean
'max_in_flight'?). Anything it cannot judge (sweep functions, `+`/`~` edits, hydra.* keys) is
left to Hydra.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, ListConfig

from frlab.config.errors import ConfigError
from frlab.config.searchpath import CONFIGS_DIR, EXPERIMENTS_DIR

ROOTS = (CONFIGS_DIR, EXPERIMENTS_DIR)


def group_dir(group: str) -> Path | None:
    """The folder holding the options of config group `group`, if it is one of frlab's."""
    for root in ROOTS:
        path = root / group
        if path.is_dir() and any(path.glob("*.yaml")):
            return path
    return None


def group_options(group: str) -> list[str]:
    path = group_dir(group)
    return sorted(p.stem for p in path.glob("*.yaml")) if path else []


def check_overrides(args: Sequence[str]) -> None:
    """Raise ConfigError for an unknown group option or an unknown dotted key in `args`."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    texts = [a for a in args if "=" in a and not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides=texts)
    except HydraException:
        return  # malformed: Hydra's own parser error is precise enough
    choices: list[str] = []
    dotted: list[str] = []
    for ov in parsed:
        key = ov.key_or_group
        if ov.type is not OverrideType.CHANGE or key.startswith("hydra") and key != "hydra":
            continue
        if group_dir(key) is not None:
            values = _values(ov)
            for value in values:
                if value not in ("null", "None") and value not in group_options(key):
                    raise ConfigError(
                        key,
                        f"unknown option {value!r} of config group `{key}`",
                        value=value,
                        choices=group_options(key),
                    )
            if values:
                choices.append(f"{key}={values[0]}")
        elif "." in key:
            dotted.append(key)
    if dotted:
        _check_keys(choices, dotted)


def _values(ov: object) -> list[str]:
    """The plain string values of a (possibly comma-sweep) override; [] if not judgeable."""
    if ov.is_sweep_override():  # type: ignore[attr-defined]
        try:
            return [str(v) for v in ov.sweep_string_iterator()]  # type: ignore[attr-defined]
        except Exception:  # range()/interval() sweeps: not option names
            return []
    value = ov.value()  # type: ignore[attr-defined]
    return [str(value)] if isinstance(value, str | int | float) or value is None else []


def _check_keys(choices: list[str], keys: list[str]) -> None:
    from frlab.config.compose import compose

    try:
        cfg = compose(choices, with_hydra=False)
    except Exception:  # let Hydra report composition problems itself
        return
    for key in keys:
        check_key_exists(cfg, key)


def check_key_exists(cfg: DictConfig, key: str) -> None:
    """Raise ConfigError if the dotted `key` is not in `cfg` (suggesting siblings)."""
    node: object = cfg
    walked: list[str] = []
    for part in key.split("."):
        if isinstance(node, ListConfig):
            return  # list indices: leave to Hydra
        if not isinstance(node, DictConfig):
            raise ConfigError(".".join(walked), f"is a value, not a mapping: cannot set {key!r}")
        if part not in node.keys():
            where = ".".join([*walked, part])
            raise ConfigError(
                where,
                f"unknown key {part!r} (to add a new key write +{key}=...)",
                value=part,
                choices=[str(k) for k in node.keys()],
            )
        walked.append(part)
        node = node._get_node(part)
