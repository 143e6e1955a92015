"""OmegaConf resolvers used by frlab's Hydra configs (run-folder names).

A single run's folder is `<log_dir>/runs/<experiment>/<date>_<time>[_<hash>]`: `frlab_suffix`
turns Hydra's `job.override_dirname` (the command-line overrides) into `_` + 6 hex digits of
its SHA-1 ("" when no override is given), so folder names stay short whatever the overrides;
the overrides themselves are in the run folder, `.hydra/overrides.yaml`. A sweep job's folder
(`frlab_subdir`) is named by its overrides when that name is short (`seed=1,ablation=q0p2`),
else `job<N>_<hash>`. Path separators are replaced so that a value like
`model.name_or_path=/data/m` never creates nested folders.
"""

from __future__ import annotations

import hashlib

from omegaconf import OmegaConf

MAX_NAME = 80


def safe_name(text: str) -> str:
    """A single path component: separators replaced."""
    return str(text).replace("/", "_").replace("\\", "_").strip()


def short_hash(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:6]


def run_suffix(override_dirname: str) -> str:
    """`_<hash of the overrides>`, or "" without overrides."""
    return f"_{short_hash(override_dirname)}" if override_dirname.strip() else ""


def sweep_subdir(job_num: object, override_dirname: str) -> str:
    """A sweep job's folder: its overrides when short, else `job<N>_<hash>`."""
    name = safe_name(override_dirname)
    if not name:
        return f"job{job_num}"
    return name if len(name) <= MAX_NAME else f"job{job_num}_{short_hash(override_dirname)}"


def register_resolvers() -> None:
    """Register once per process (idempotent)."""
    for name, fn in (("frlab_suffix", run_suffix), ("frlab_subdir", sweep_subdir)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
