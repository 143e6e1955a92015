"""The reference of every config key, `docs/config-keys.md`, rendered from the declarations.

Every table row comes from a declaration (frlab.config.schema: type, default, allowed values,
meaning), from the registered objective components, or from the option files of the config
groups (env, logger, callbacks: their keys and comments).
`python -m frlab.generated --write` rewrites it with the other generated files.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any

from frlab.config import schema
from frlab.config.compose import group_dir, group_options
from frlab.config.declare import Meta, declared, default_of, interval, meta_of, section_type, unwrap

GROUPS = (
    "model",
    "env",
    "rollout",
    "rollout/engine",
    "data",
    "objective",
    "optim",
    "trainer",
    "logger",
    "callbacks",
    "eval",
    "paths",
    "hydra",
    "ablation",
    "experiment",
    "sweep",
)

HEAD = """# frlab config schema

Generated from the declarations by `python -m frlab.generated --write` (do not edit by hand;
a test checks that this file is current). Every key's type, default and allowed values are
declared once, as structured configs in `frlab/config/schema.py` (the root, its sections and
the `trainer`, `rollout.engine`, `rollout.remote` and `eval` nodes). Hydra checks types and
unknown keys while it composes; preflight checks ranges and the rules between keys; both report
`frlab: config error: config key `KEY`: ...` with close matches and exit with code 2.

Where a key's meaning cites "the paper" or "the reference": the FlashREINFORCE
[paper](https://github.com/yifanzhang-pro/FlashREINFORCE) and its [reference
implementation](https://github.com/NVIDIA-NeMo/labs-molt).

Hydra root: `configs/train.yaml`; groups under `configs/`; experiment presets in
`experiments/experiment/NAME.yaml` and sweep presets in `experiments/sweep/NAME.yaml`
(`experiments/` is on Hydra's search path). Defaults (the choices Hydra composes with no
arguments, from `configs/train.yaml`):

`{choices}`

so `python -m frlab` runs `{experiment}`. A group option only sets the values that differ from
the defaults below. The rollout engine is the config group `rollout/engine`
(`rollout/engine=NAME`); every Lightning argument is a declared `trainer.KEY`.
"""

TAIL = """## Run folders and metrics

Where a run writes, what `metrics.csv` and `summary.json` hold and every metric's meaning:
`docs/configuration.md`, section "The run folder".
"""


def type_name(annotation: Any, meta: Meta) -> str:
    """A declared type in words: int, float | null, mapping, list[str], [float, float], ..."""
    inner, optional = unwrap(annotation)
    origin = typing.get_origin(inner) or inner
    if meta.kind is not None:
        return " | ".join([meta.kind.__name__, *meta.words])
    if meta.pair:
        name = "[float, float]"
    elif dataclasses.is_dataclass(inner) or inner in (int, float, bool, str):
        name = inner.__name__
    elif origin is dict:
        name = "mapping"
    elif origin is list:
        name = str(inner).replace("typing.", "")
    else:
        name = "any"
    return f"{name} | null" if optional and name != "any" else name


def show(value: Any) -> str:
    if value is dataclasses.MISSING or dataclasses.is_dataclass(value):
        return ""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str) and value == "???":
        return "??? (required)"
    return str(value)


def allowed_of(meta: Meta) -> str:
    return " | ".join(meta.choices) if meta.choices else interval(meta)


def row(cells: list[str]) -> str:
    """A markdown table row (pipes inside cells escaped)."""
    return "| " + " | ".join(c.replace("\n", " ").replace("|", "\\|") for c in cells) + " |"


def table(prefix: str, cls: type) -> list[str]:
    """One markdown table of a declaration (nested sections get their own table)."""
    rows = ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    nested: list[tuple[str, type]] = []
    for f, annotation in declared(cls):
        meta, sub = meta_of(f), section_type(annotation)
        if sub is not None:
            nested.append((f"{prefix}.{f.name}", sub))
        doc = meta.doc + (" (read by frlab, not passed to `_target_`)" if not meta.arg else "")
        default = show(default_of(f))
        cells = [
            f"`{prefix}.{f.name}`",
            type_name(annotation, meta),
            f"`{default}`" if default else "",
            allowed_of(meta),
            doc or (sub.__doc__ or ""),
        ]
        rows.append(row(cells))
    out = [f"### `{prefix}` ({cls.__name__})", "", (cls.__doc__ or "").strip(), "", *rows, ""]
    for key, sub in nested:
        out += table(key, sub)
    return out


def yaml_keys(path: Path) -> list[tuple[str, str, str]]:
    """(key, value, comment) of the top-level lines of a group option file."""
    out = []
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z_][\w]*):\s*([^#]*?)\s*(?:#\s*(.*))?$", line)
        if match and match.group(1) != "defaults":
            out.append((match.group(1), match.group(2), match.group(3) or ""))
    return out


def option_tables(group: str, title: str) -> list[str]:
    """The keys each option of an open group (env, logger, callbacks) sets, from its file."""
    folder = group_dir(group)
    out = [f"### `{title}` options", ""]
    for name in group_options(group):
        out += [f"`{group}={name}`:", "", "| key | value | meaning |", "|---|---|---|"]
        for key, value, comment in yaml_keys(folder / f"{name}.yaml"):  # type: ignore[operator]
            out.append(row([f"`{title}.{key}`", f"`{value}`" if value else "(mapping)", comment]))
        out.append("")
    return out


def objective_section() -> list[str]:
    """The objective node, from the component declarations (frlab.objective.catalog)."""
    from frlab.objective.catalog import component_metrics_text, schema_objective_section

    intro = (
        "Component names (plain strings), one per slot, and each component's "
        "hyperparameters under its own name (`objective.NAME.ARG`), declared once on the "
        "component class and checked by the objective itself (Objective.from_config); presets "
        "`objective=" + "|".join(group_options("objective")) + "`."
    )
    return [
        "## `objective`",
        "",
        intro,
        "",
        "```yaml",
        "# objective:begin (generated from the component declarations)",
        schema_objective_section(),
        "# objective:end",
        "```",
        "",
        "Component metrics:",
        "",
        component_metrics_text(),
        "",
    ]


def default_choices() -> dict[str, str]:
    """{group: option} Hydra composes with no arguments (frlab's groups, none left unset)."""
    from frlab.config.compose import compose

    choices = compose(()).hydra.runtime.choices
    return {
        g: str(o)
        for g, o in choices.items()
        if o is not None
        and g.split("/")[0] in GROUPS
        and g.split("/")[0] != "hydra"
        and "@" not in g
    }


def generate() -> str:
    choices = default_choices()
    shown = " ".join(f"{g}={o}" for g, o in reversed(list(choices.items())))
    head = HEAD.format(choices=shown, experiment=choices["experiment"])
    out = [head, "## Config groups", "", "| group | options |", "|---|---|"]
    out += [row([f"`{g}`", ", ".join(group_options(g))]) for g in GROUPS if group_options(g)]
    out += ["", "## Keys", ""]
    root_scalars = [f for f, a in declared(schema.FrlabConfig) if section_type(a) is None]
    out += ["| key | type | default | meaning |", "|---|---|---|---|"]
    hints = dict((f.name, a) for f, a in declared(schema.FrlabConfig))
    for f in root_scalars:
        out.append(
            row(
                [
                    f"`{f.name}`",
                    type_name(hints[f.name], meta_of(f)),
                    f"`{show(default_of(f))}`",
                    meta_of(f).doc,
                ]
            )
        )
    out.append("")
    for name in ("model", "rollout", "data", "optim", "paths"):
        out += table(name, section_type(hints[name]))  # type: ignore[arg-type]
    out += table("rollout.remote", schema.RemoteConfig)
    for name, cls in schema.ENGINES.items():
        out += [f"`rollout/engine={name}`:", ""] + table("rollout.engine", cls)
    out += table("trainer", schema.TrainerConfig)
    refused = "; ".join(f"`{k}` ({v})" for k, v in schema.TrainerConfig.REFUSED.items())
    out += [f"Refused trainer arguments: {refused}.", ""]
    out += option_tables("env", "env") + objective_section()
    for kind, cls in schema.EVALS.items():
        out += [f"`eval` of kind `{kind}`:", ""] + table("eval", cls)
    out += table("eval.benchmarks.NAME", schema.MathBenchmarkConfig)
    out += option_tables("logger", "logger") + option_tables("callbacks", "callbacks") + [TAIL]
    return "\n".join(out).rstrip() + "\n"
