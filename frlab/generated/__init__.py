"""The committed files generated from frlab's declarations, compared and rewritten in one place.

- `configs/objective/params/default.yaml`, `configs/objective/<preset>.yaml` and the component
  table of `README.md`: from the objective components and presets (frlab.objective.catalog);
- `docs/config-keys.md`, the reference of every config key: from the config declarations
  (frlab.generated.config_keys).

`tests/objective/test_catalog.py` and `tests/config/test_schema.py` fail while one is stale.
It sits above both packages, so that neither imports the other to write the docs.

    python -m frlab.generated           # exit 1 and list the stale files
    python -m frlab.generated --write   # rewrite them (atomically)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from frlab.fsio import write_text_atomic
from frlab.objective.catalog import (
    KEYS_FILE,
    PARAMS_FILE,
    PRESETS_DIR,
    README_FILE,
    REGENERATE,
    ROOT,
    component_table,
    default_params_yaml,
    preset_yaml,
)
from frlab.objective.presets import PRESETS

MARKERS = {
    README_FILE: [
        ("<!-- components:begin (generated: {cmd}) -->", "<!-- components:end -->", component_table)
    ],
}
# docs/config-keys.md is generated whole by frlab.generated.config_keys, which takes its objective
# section from schema_objective_section and component_metrics_text (expected_files adds it).


def _replace_between(text: str, begin: str, end: str, body: str, path: Path) -> str:
    begin = begin.format(cmd=REGENERATE)
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        raise ValueError(f"{path}: markers {begin!r} ... {end!r} not found")
    return text[: i + len(begin)] + "\n" + body + "\n" + text[j:]


def expected_files(root: Path = ROOT) -> dict[Path, str]:
    """path -> the full text it must have (the generated parts substituted)."""
    from frlab.generated.config_keys import generate  # loads Hydra: only when compared

    out = {PARAMS_FILE: default_params_yaml()}
    out.update({PRESETS_DIR / f"{name}.yaml": preset_yaml(name) for name in PRESETS})
    for path, parts in MARKERS.items():
        text = (root / path).read_text()
        for begin, end, make in parts:
            text = _replace_between(text, begin, end, make(), path)
        out[path] = text
    out[KEYS_FILE] = generate()
    return out


def stale_files(root: Path = ROOT) -> list[Path]:
    """Committed files whose generated parts differ from the declarations."""
    return [p for p, text in expected_files(root).items() if (root / p).read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the stale files")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository checkout")
    args = parser.parse_args(argv)
    stale = stale_files(args.root)
    if args.write:
        for path, text in expected_files(args.root).items():
            if path in stale:
                write_text_atomic(args.root / path, text)  # a reader sees old or new text
                print(f"wrote {path}")
        return 0
    for path in stale:
        print(f"{path} is stale: run `{REGENERATE}`", file=sys.stderr)
    return 1 if stale else 0
