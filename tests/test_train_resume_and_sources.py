"""frlab.train refuses, naming the key, what Lightning or transformers would otherwise turn into
a silent fresh start (`ckpt_path=last` with nothing to resume) or a raw traceback (a model
source that cannot be loaded)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from frlab.config.arguments import declared_arguments
from frlab.config.errors import ConfigError
from frlab.config.schema import ModelConfig
from frlab.run.guard import check_resume
from frlab.train import build_policy_from

ENV_CFG = OmegaConf.create({"callbacks": {"model_checkpoint": {"dirpath": None}}})


def test_resume_last_needs_last_ckpt_in_the_run_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        check_resume("last", ENV_CFG, tmp_path)
    assert info.value.key == "ckpt_path" and "hydra.run.dir" in str(info.value)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"x")
    check_resume("last", ENV_CFG, tmp_path)  # found: no error
    check_resume(None, ENV_CFG, tmp_path)  # no resume asked


def test_resume_last_follows_the_checkpoint_callbacks_dirpath_and_symlinks(tmp_path: Path) -> None:
    """FSDP2 publishes `last.ckpt` as a symlink to a folder of shards."""
    ckpts = tmp_path / "elsewhere"
    ckpts.mkdir()
    cfg = OmegaConf.create({"callbacks": {"model_checkpoint": {"dirpath": str(ckpts)}}})
    with pytest.raises(ConfigError, match="elsewhere"):
        check_resume("last", cfg, tmp_path)
    (ckpts / ".shards-1").mkdir()
    (ckpts / "last.ckpt").symlink_to(ckpts / ".shards-1")
    check_resume("last", cfg, tmp_path)


def test_an_explicit_checkpoint_path_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        check_resume(str(tmp_path / "nope.ckpt"), ENV_CFG, tmp_path)
    assert info.value.key == "ckpt_path"


def test_an_unloadable_model_source_names_model_name_or_path(tmp_path: Path) -> None:
    missing = tmp_path / "no_model_here"
    missing.mkdir()
    with pytest.raises(ConfigError) as info:
        build_policy_from(declared_arguments(ModelConfig, name_or_path=str(missing)), seed=0)
    assert info.value.key == "model.name_or_path" and str(missing) in str(info.value)


@pytest.mark.slow
def test_cli_resume_without_a_checkpoint_exits_2_naming_ckpt_path(tmp_path: Path) -> None:
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "frlab", "ckpt_path=last", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "config key `ckpt_path`" in out.stderr
    assert not (tmp_path / "run" / "metrics.csv").exists()  # nothing trained
