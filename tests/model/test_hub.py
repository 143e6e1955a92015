"""frlab.model.hub: the offline flags read as huggingface_hub reads them, the local cache, and
why a model source cannot be used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from frlab.model import hub

FLAG_CASES = [
    {},
    {"HF_HUB_OFFLINE": "1"},
    {"HF_HUB_OFFLINE": "yes"},
    {"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"},  # the first flag set decides
    {"TRANSFORMERS_OFFLINE": "true"},
    {"TRANSFORMERS_OFFLINE": "2"},
    {"HF_HUB_OFFLINE": "", "TRANSFORMERS_OFFLINE": "ON"},  # an empty flag counts as unset
    {"HF_HUB_OFFLINE": " 1"},
]


def test_hub_offline_agrees_with_huggingface_hub_itself() -> None:
    """huggingface_hub computes HF_HUB_OFFLINE once, when its constants module is imported:
    a fresh interpreter per case imports it under each setting and compares."""
    code = (
        "import json, os, sys\n"
        "for k in ('HF_HUB_OFFLINE', 'TRANSFORMERS_OFFLINE'):\n"
        "    os.environ.pop(k, None)\n"
        "os.environ.update(json.loads(sys.argv[1]))\n"
        "from huggingface_hub import constants\n"
        "from frlab.model.hub import hub_offline\n"
        "print(json.dumps([bool(constants.HF_HUB_OFFLINE), hub_offline()]))\n"
    )
    for case in FLAG_CASES:
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(case)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        theirs, ours = json.loads(out.stdout.strip().splitlines()[-1])
        assert ours == theirs, case


def test_model_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert hub.source_problem(str(tmp_path)) is None  # an existing folder
    assert "not an existing folder" in hub.source_problem(str(tmp_path / "nope"))
    (tmp_path / "weights.bin").write_text("")
    assert "is a file, not a model folder" in hub.source_problem(str(tmp_path / "weights.bin"))
    assert "GGUF file not found" in hub.source_problem(f"gguf:{tmp_path / 'm.gguf'}")
    assert hub.source_problem("gguf:smollm2-135m-instruct") is None  # fetched on first use
    assert "neither a known GGUF" in hub.source_problem("gguf:no-such-package")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    assert "not in the local Hugging Face cache" in hub.source_problem("org/not-cached-model")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")
    assert hub.source_problem("org/not-cached-model") is None  # online: it can download


def test_a_model_in_the_local_cache_counts_as_cached(tmp_path: Path, monkeypatch) -> None:
    """The cache layout huggingface_hub reads (models--ORG--NAME/snapshots/REV, refs/main)."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    folder = cache / "models--org--tiny" / "snapshots" / ("0" * 40)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (cache / "models--org--tiny" / "refs").mkdir()
    (cache / "models--org--tiny" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    assert hub.cached_on_hub("org/tiny")
    assert not hub.cached_on_hub("org/other")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.source_problem("org/tiny") is None
