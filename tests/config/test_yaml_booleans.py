"""Every YAML file frlab ships gives a key declared bool a boolean: OmegaConf, composing, would
read `pack_sequences: 3` as true and `0` as false without a word, so the command line's check
(frlab.config.preflight, on the job's overrides) has this counterpart for the files themselves."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from frlab.config.compose import CONFIGS_DIR, EXPERIMENTS_DIR
from frlab.config.declare import declared_bool, is_boolean, join
from frlab.config.schema import TYPED_NODES, FrlabConfig

# run folders a write-up ships (`.hydra/`) record a run; they are not composed again
FILES = sorted(
    path
    for path in [*CONFIGS_DIR.rglob("*.yaml"), *EXPERIMENTS_DIR.rglob("*.yaml")]
    if ".hydra" not in path.parts
)


def package(path: Path, text: str) -> str:
    """The key a file's values sit under: its `# @package` header, else its group's path."""
    for line in text.splitlines():
        if line.startswith("# @package"):
            name = line.split()[-1]
            return "" if name == "_global_" else name
    root = CONFIGS_DIR if path.is_relative_to(CONFIGS_DIR) else EXPERIMENTS_DIR
    return ".".join(path.relative_to(root).parent.parts)


def non_booleans(values: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    """(full key, value) of each value that is not a boolean (nor null, nor an interpolation)
    on a key declared bool (the root's, or an open node's declarations)."""
    for name, value in values.items():
        full = join(prefix, name)
        if isinstance(value, Mapping):
            yield from non_booleans(value, full)
        elif not is_boolean(value) and declared_bool(FrlabConfig, full, TYPED_NODES):
            yield full, value


def file_non_booleans(path: Path) -> list[tuple[str, Any]]:
    text = path.read_text()
    return list(non_booleans(yaml.safe_load(text) or {}, package(path, text)))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(p.parents[2])))
def test_a_shipped_file_gives_bool_keys_booleans(path: Path) -> None:
    assert not file_non_booleans(path)


def test_the_check_sees_a_number_on_a_bool_key(tmp_path: Path) -> None:
    """In a global preset (engine and eval keys too), and in a group option, whose values sit
    under its folder's key."""
    preset = tmp_path / "bad_preset.yaml"
    preset.write_text(
        "# @package _global_\ndata: {pack_sequences: 0}\nrollout:\n"
        "  engine: {packed_prefill: yes_please}\neval: {at_start: 1}\n"
    )
    assert file_non_booleans(preset) == [
        ("data.pack_sequences", 0),
        ("rollout.engine.packed_prefill", "yes_please"),
        ("eval.at_start", 1),
    ]
    assert list(non_booleans({"pack_sequences": 3, "batch_size": 4}, "data")) == [
        ("data.pack_sequences", 3)
    ]
    assert package(CONFIGS_DIR / "data" / "default.yaml", "") == "data"
    assert package(CONFIGS_DIR / "rollout" / "engine" / "torch.yaml", "") == "rollout.engine"
