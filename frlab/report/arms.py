"""Runs -> experiments -> arms, and which runs of an arm the statistics use.

An arm is every run whose config is the same once the seed and the run's bookkeeping (output
folders, logger, plots, the sweep and experiment names) are set aside; runs of different
experiments never share a table. An arm is named by config keys, never by folders or hashes:
by the config-group choices that tell the arms apart (`ablation=pg_is`) where they do, else by
the keys in which it differs from the preset arm (`objective.trust_region=none`). The preset arm
is the one whose values of the differing keys are those of the experiment's preset, as this
checkout composes it (a sweep that lists the preset's own value, `objective.trust_region=
sequence_bernoulli_kl,none`, has one); where the preset cannot be composed, the arm whose runs
changed nothing on the command line but the seed and bookkeeping (and the ablation group's
declared no-op arm, `ablation=base`).

Of an arm's runs, the finished ones are used; every other run is listed with its reason (and
used, over its last window, with `include_unfinished`). Two runs of one arm with the same seed
(the same sweep run twice) count once: the one with more updates, then the newer, is used.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from frlab.report.runs import ReportError, Run, flatten

BOOKKEEPING = frozenset(
    {"seed", "paths", "logger", "plots", "dry_run", "overwrite", "ckpt_path", "task_name", "hydra"}
    | {"experiment", "sweep"}
)
PATH_NAMES = frozenset({"path", "dirpath", "output_dir", "log_dir", "save_dir"})
NO_OP_OVERRIDES = frozenset({"ablation=base", "ablation=null"})
ABSENT = "(absent)"  # a key one arm's config does not have (an older frlab)


def is_bookkeeping(key: str) -> bool:
    """Config keys that say where a run writes, not what it trains (`callbacks.x.path` too)."""
    parts = key.split(".")
    return parts[0] in BOOKKEEPING or (parts[0] == "callbacks" and parts[-1] in PATH_NAMES)


def override_key(override: str) -> str:
    """`+a.b=1` / `~a.b` / `a.b=1` -> `a.b`."""
    return override.lstrip("+~").split("=", 1)[0]


def runs_as_preset(run: Run) -> bool:
    """Whether the run's command line changed nothing but the seed and bookkeeping."""
    return all(
        is_bookkeeping(override_key(o)) or o in NO_OP_OVERRIDES for o in run.overrides
    ) and bool(run.config)


@dataclass
class Use:
    """Whether one run's numbers enter its arm's statistics, and why not."""

    run: Run
    used: bool
    reason: str = ""


@dataclass
class Arm:
    """Runs of one experiment with one config (seed and bookkeeping aside)."""

    experiment: str
    config: dict[str, Any]
    runs: list[Run]
    label: str = ""
    differences: dict[str, Any] = field(default_factory=dict)  # the keys that differ between arms
    is_preset: bool = False
    uses: list[Use] = field(default_factory=list)

    @property
    def used(self) -> list[Run]:
        """The runs the statistics use, in seed order."""
        runs = [u.run for u in self.uses if u.used]
        return sorted(runs, key=lambda r: (r.seed is None, r.seed or 0, str(r.path)))

    @property
    def header(self) -> str:
        return f"{self.label}: {len(self.used)} used of {len(self.runs)} launched"


def _arm_config(run: Run) -> dict[str, Any]:
    return {k: v for k, v in run.config.items() if not is_bookkeeping(k)}


def _fingerprint(config: Mapping[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=str)


def group_arms(runs: Iterable[Run]) -> dict[str, list[Arm]]:
    """Experiment -> its arms (runs without a config record go to no arm: see `unplaced`)."""
    experiments: dict[str, dict[str, Arm]] = {}
    for run in runs:
        if not run.config:
            continue
        config = _arm_config(run)
        arms = experiments.setdefault(run.experiment, {})
        arm = arms.setdefault(_fingerprint(config), Arm(run.experiment, config, []))
        arm.runs.append(run)
    return {name: _named(list(arms.values())) for name, arms in sorted(experiments.items())}


def unplaced(runs: Iterable[Run]) -> list[Run]:
    """Runs whose folder has no `.hydra/config.yaml`: no arm can be told for them."""
    return [r for r in runs if not r.config]


def differing_keys(arms: Sequence[Arm]) -> list[str]:
    keys = sorted({k for arm in arms for k in arm.config})
    return [k for k in keys if len({_value(a, k) for a in arms}) > 1]


def _choices(arm: Arm) -> dict[str, Any] | None:
    """The arm's config-group choices, if all its runs agree on them."""
    seen = {_fingerprint(r.choices) for r in arm.runs}
    if len(seen) != 1:
        return None
    return {k: v for k, v in arm.runs[0].choices.items() if k.split("/")[0] not in BOOKKEEPING}


def _named(arms: list[Arm]) -> list[Arm]:
    """Label every arm, preset arm first, then in label order."""
    keys = differing_keys(arms)
    preset = preset_config(arms[0].experiment) if keys else None
    for arm in arms:
        arm.differences = {k: arm.config.get(k, ABSENT) for k in keys}
        if preset is not None:
            arm.is_preset = all(
                _same(arm.config.get(k, ABSENT), preset.get(k, ABSENT)) for k in keys
            )
        else:
            arm.is_preset = all(runs_as_preset(r) for r in arm.runs)
    reference = next((a for a in arms if a.is_preset), arms[0])
    by_choice = _choice_labels(arms)
    for arm in arms:
        arm.label = by_choice.get(id(arm)) or _key_label(arm, reference, keys)
    return sorted(arms, key=lambda a: (not a.is_preset, a.label))


def _choice_labels(arms: Sequence[Arm]) -> dict[int, str]:
    """`group=option` labels where the differing group choices tell every arm apart."""
    choices = [c for c in map(_choices, arms) if c is not None]
    if len(arms) < 2 or len(choices) < len(arms):
        return {}
    groups = sorted({g for c in choices for g in c})
    differ = [g for g in groups if len({str(c.get(g)) for c in choices}) > 1]
    labels = [", ".join(f"{g}={c.get(g)}" for g in differ) for c in choices]
    if not differ or len(set(labels)) < len(arms):
        return {}
    return {id(a): label for a, label in zip(arms, labels, strict=True)}


def _key_label(arm: Arm, reference: Arm, keys: Sequence[str]) -> str:
    if len(keys) == 0:
        return "preset" if arm.is_preset else "all runs"
    if arm is reference:
        return "preset" if arm.is_preset else _pairs(arm, keys)
    return _pairs(arm, [k for k in keys if _value(arm, k) != _value(reference, k)])


def _value(arm: Arm, key: str) -> str:
    return _fingerprint({0: arm.config.get(key, ABSENT)})


def _same(a: Any, b: Any) -> bool:
    return _fingerprint({0: a}) == _fingerprint({0: b})


def preset_config(experiment: str) -> dict[str, Any] | None:
    """The experiment preset's own config as this checkout composes it (flattened, as Hydra
    records it: interpolations unresolved), or None where it cannot be composed (a preset
    renamed or removed since the runs; Hydra missing): then an arm is the preset arm when its
    runs changed nothing on the command line but the seed and bookkeeping."""
    try:
        from omegaconf import OmegaConf

        from frlab.config.compose import compose

        config = compose([f"experiment={experiment}"], with_hydra=False)
        return flatten(OmegaConf.to_container(config, resolve=False))
    except Exception:
        return None


def _pairs(arm: Arm, keys: Sequence[str]) -> str:
    return ", ".join(f"{k}={_short(arm.config.get(k, ABSENT))}" for k in keys)


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if isinstance(value, list | dict) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def choose_runs(arm: Arm, include_unfinished: bool) -> None:
    """Set `arm.uses`: finished runs (and, if asked, unfinished ones with an update), one per
    seed; every run left out gets its reason."""
    uses = []
    for run in arm.runs:
        if run.status == "finished":
            uses.append(Use(run, True))
        elif include_unfinished and run.last_update > 0:
            uses.append(Use(run, True, f"{run.status}: its last window used"))
        else:
            reason = f"{run.status} ({run.status_detail})" if run.status_detail else run.status
            if run.last_update == 0 and include_unfinished:
                reason += "; no update written"
            uses.append(Use(run, False, reason))
    by_seed: dict[int, list[Use]] = {}
    for use in uses:
        if use.used and use.run.seed is not None:
            by_seed.setdefault(use.run.seed, []).append(use)
    for seed, same in by_seed.items():
        same.sort(key=lambda u: (-u.run.last_update, u.run.age_s))
        for extra in same[1:]:
            extra.used, extra.reason = False, f"seed {seed} twice: {same[0].run.path} used"
    arm.uses = uses


def pick_baseline(arms: Sequence[Arm], wanted: str | None) -> Arm:
    """`--baseline` (an arm's label, or a part of exactly one label), else the preset arm, else
    the first arm."""
    if wanted is None:
        return next((a for a in arms if a.is_preset), arms[0])
    exact = [a for a in arms if a.label == wanted]
    partial = [a for a in arms if wanted in a.label]
    found = exact or partial
    if len(found) != 1:
        labels = "; ".join(a.label for a in arms)
        what = "matches no arm" if not found else "matches several arms"
        raise ReportError(f"--baseline {wanted!r} {what} (arms: {labels})")
    return found[0]
