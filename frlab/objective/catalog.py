"""The texts generated from the component declarations and the presets (nothing listed by hand).

A new component or preset needs no hand edit outside its own file: this module builds the
per-component defaults `configs/objective/params/default.yaml` (`default_params_yaml`), one
option file per preset `configs/objective/<preset>.yaml` (`preset_yaml`, the `objective` config
group), the component table of `README.md` (`component_table`) and the objective section and
component metric names of `docs/config-keys.md`; `python -m frlab.generated --write`
rewrites every committed generated file, and the tests fail while one is stale.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

from frlab.objective.base import Component, Diagnostic
from frlab.objective.objective import KINDS
from frlab.objective.presets import DEFAULTS, PRESET_NOTES, PRESETS

ROOT = Path(__file__).resolve().parents[2]
PARAMS_FILE = Path("configs/objective/params/default.yaml")
PRESETS_DIR = Path("configs/objective")  # the `objective` config group: one file per preset
README_FILE = Path("README.md")
KEYS_FILE = Path("docs/config-keys.md")  # the config key reference (frlab.generated)
REGENERATE = "python -m frlab.generated --write"  # the command that rewrites them (frlab.generated)


def kind_title(kind: str) -> str:
    """A component kind as the README's table names it (`trust_region` -> `trust region`)."""
    return kind.replace("_", " ")


def components() -> list[tuple[str, type[Component]]]:
    """(kind, class) of every registered component, kinds in slot order, then registration."""
    registries: dict[str, Any] = KINDS
    return [(kind, cls) for kind, reg in registries.items() for cls in reg.in_order()]


def default_params() -> dict[str, dict[str, Any]]:
    """component name -> {hyperparameter: default}, for components that declare any."""
    return {cls.name: cls.defaults() for _, cls in components() if cls.hyperparameters()}


def yaml_number(x: Any) -> str:
    """A YAML 1.1 scalar that OmegaConf reads back as the same number (`3.0e-3`, `.inf`)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise TypeError(f"not a number: {x!r}")
    if isinstance(x, int):
        return str(x)
    if math.isinf(x):
        return ".inf" if x > 0 else "-.inf"
    if x != 0 and abs(x) < 1e-2:
        mantissa, exponent = f"{x:e}".split("e")
        mantissa = mantissa.rstrip("0")
        return (
            f"{mantissa}0e{int(exponent)}"
            if mantissa.endswith(".")
            else f"{mantissa}e{int(exponent)}"
        )
    return repr(float(x))


def _flow(params: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {yaml_number(v)}" for k, v in params.items()) + "}"


def default_params_yaml() -> str:
    """The text of configs/objective/params/default.yaml."""
    lines = [
        f"# Generated from the components' declarations by `{REGENERATE}`; do not edit.",
        "# Per-component hyperparameters, each under its component's own name, so that switching a",
        "# component (objective.trust_region=...) never carries another component's settings "
        "along.",
    ]
    lines += [f"{name}: {_flow(params)}" for name, params in default_params().items()]
    return "\n".join(lines) + "\n"


def _hyperparameters_cell(cls: type[Component]) -> str:
    return "; ".join(
        f"`{h.name}` = {yaml_number(h.default)} in {h.range_text()}" for h in cls.hyperparameters()
    )


def _diagnostics_cell(cls: type[Component]) -> str:
    diagnostics: tuple[Diagnostic, ...] = getattr(cls, "diagnostics", ())
    return ", ".join(f"`{d.metric(cls.name)}`" for d in diagnostics)


def component_table() -> str:
    """The README table: kind, name, maths, hyperparameters, logged diagnostics, source."""
    rows = [
        "| kind | name | maths | hyperparameters (default, range) | logged diagnostics | from |",
        "|---|---|---|---|---|---|",
    ]
    for kind, cls in components():
        maths = cls.summary().rstrip(".")
        cells = (
            kind_title(kind),
            f"`{cls.name}`",
            maths,
            _hyperparameters_cell(cls),
            _diagnostics_cell(cls),
            cls.source,
        )
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _comment_lines(indent: int, words: list[str], sep: str, width: int = 100) -> list[str]:
    """`words` joined by `sep` as `# ...` comments starting at column `indent`, wrapped."""
    lines, line = [], ""
    for word in words:
        piece = word if not line else f"{line}{sep}{word}"
        if line and indent + 2 + len(piece) > width:
            lines.append(line + sep.rstrip())
            line = word
        else:
            line = piece
    return [" " * indent + "# " + text for text in [*lines, line]]


def _commented(key_line: str, notes: list[str]) -> list[str]:
    """`key_line` with the first comment on the same line when it fits before the column."""
    col = len(notes[0]) - len(notes[0].lstrip())
    if len(key_line) < col:
        return [key_line.ljust(col) + notes[0].lstrip(), *notes[1:]]
    return [key_line, *notes]


def schema_objective_section() -> str:
    """The `objective:` node of the key reference's layout (slot names, defaults, ranges, docs)."""
    col = 27  # the comment column of the key reference's layout
    lines = [
        "objective:".ljust(col) + "# component names (plain strings) + per-component "
        "kwargs under own name"
    ]
    for kind, reg in KINDS.items():
        names = [n.name for n in reg.in_order()]  # type: ignore[attr-defined]
        names = [DEFAULTS[kind], *(n for n in names if n != DEFAULTS[kind])]
        lines += _commented(f"  {kind}: {DEFAULTS[kind]}", _comment_lines(col, names, " | "))
    for _, cls in components():
        if cls.hyperparameters():
            notes = [
                line
                for h in cls.hyperparameters()
                for line in _comment_lines(
                    col, f"{h.name} in {h.range_text()}: {h.doc}".split(), " "
                )
            ]
            lines += _commented(f"  {cls.name}: {_flow(cls.defaults())}", notes)
    lines.append(f"  # presets: objective={' | '.join(PRESETS)}")
    return "\n".join(lines)


def component_metrics_text() -> str:
    """The key reference's list item of the component diagnostics metric names."""
    names = [d.metric(cls.name) for _, cls in components() for d in getattr(cls, "diagnostics", ())]
    accept = ", ".join(
        f"`{cls.name}`" for kind, cls in components() if kind == "trust_region" and cls.admits_all
    )
    text = (
        "- objective components (the chosen trust region's; frlab/objective/trust_regions.py): "
        + ", ".join(f"`{n}`" for n in names)
        + f"; trust regions that admit every trajectory by construction ({accept}) log no "
        "`train/acceptance_rate`;"
    )
    return textwrap.fill(text, width=100, subsequent_indent="  ", break_on_hyphens=False)


# --------------------------------------------------------------------------- committed files


def preset_yaml(name: str) -> str:
    """The text of configs/objective/<name>.yaml: the preset's components over the defaults."""
    lines = [
        f"# {PRESET_NOTES[name]}",
        f"# Generated from frlab.objective.PRESETS by `{REGENERATE}`; do not edit.",
        "defaults:",
        "  - params@_here_: default",
        "  - _self_",
    ]
    lines += [f"{slot}: {component}" for slot, component in PRESETS[name].items()]
    return "\n".join(lines) + "\n"
