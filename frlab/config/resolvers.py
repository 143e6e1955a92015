"""OmegaConf resolvers used by frlab's Hydra configs (run-folder names).

`frlab_suffix` turns Hydra's `job.override_dirname` into a folder-name suffix ("" when no
override is given, otherwise "_" + the overrides); `frlab_subdir` names a sweep job's folder by
its overrides, falling back to the job number. Path separators in override values are replaced
so that a value like `model.name_or_path=/data/m` never creates nested folders.
"""

from __future__ import annotations

from omegaconf import OmegaConf

MAX_NAME = 180


def safe_name(text: str) -> str:
    """A single path component: separators replaced, length capped."""
    name = str(text).replace("/", "_").replace("\\", "_").strip()
    return name[:MAX_NAME]


def run_suffix(override_dirname: str) -> str:
    name = safe_name(override_dirname)
    return f"_{name}" if name else ""


def sweep_subdir(job_num: object, override_dirname: str) -> str:
    name = safe_name(override_dirname)
    return name if name else f"job{job_num}"


def register_resolvers() -> None:
    """Register once per process (idempotent)."""
    for name, fn in (("frlab_suffix", run_suffix), ("frlab_subdir", sweep_subdir)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
