"""The Hydra record of a run folder is kept before Hydra writes a new one
(frlab.run.hydra_record)."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from frlab.run.hydra_record import KeepRunRecord, keep_record


def _record(run: Path, text: str) -> Path:
    hydra = run / ".hydra"
    hydra.mkdir(parents=True)
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        (hydra / name).write_text(f"{name}: {text}\n")
    return hydra


def _config(run: Path, **top: object) -> object:
    return OmegaConf.create(
        {
            "hydra": {"run": {"dir": str(run)}, "output_subdir": ".hydra"},
            "ckpt_path": None,
            "dry_run": False,
            "overwrite": False,
            **top,
        }
    )


def test_keep_record_copies_every_launch_and_never_replaces_one(tmp_path: Path) -> None:
    hydra = _record(tmp_path / "run", "first")
    first = keep_record(hydra)
    (hydra / "config.yaml").write_text("config.yaml: second\n")
    second = keep_record(hydra)  # same second: a suffixed name, the first copy untouched
    assert first != second and first.parent == second.parent == hydra / "previous"
    assert (first / "config.yaml").read_text() == "config.yaml: first\n"
    assert (second / "config.yaml").read_text() == "config.yaml: second\n"
    assert sorted(p.name for p in first.iterdir()) == [
        "config.yaml",
        "hydra.yaml",
        "overrides.yaml",
    ]
    assert not list((hydra / "previous").glob(".tmp-*"))
    assert keep_record(tmp_path / "nothing") is None


def test_a_new_run_in_a_used_folder_stops_before_hydra_writes(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    _record(run, "first")
    (run / "metrics.csv").write_text("step\n1\n")
    with pytest.raises(SystemExit) as info:
        KeepRunRecord().on_run_start(_config(run))
    assert info.value.code == 2
    assert "already holds a run" in capsys.readouterr().err
    assert not (run / ".hydra" / "previous").exists()


@pytest.mark.parametrize("top", [{"ckpt_path": "last"}, {"dry_run": True}, {"overwrite": True}])
def test_resume_dry_run_and_overwrite_keep_the_earlier_record(tmp_path, top) -> None:
    run = tmp_path / "run"
    _record(run, "first")
    (run / "metrics.csv").write_text("step\n1\n")
    KeepRunRecord().on_run_start(_config(run, **top))
    (kept,) = (run / ".hydra" / "previous").iterdir()
    assert (kept / "overrides.yaml").read_text() == "overrides.yaml: first\n"


def test_a_fresh_folder_is_left_alone(tmp_path: Path) -> None:
    KeepRunRecord().on_run_start(_config(tmp_path / "new"))
    assert not (tmp_path / "new").exists()


def test_a_gpu_preset_on_a_cpu_machine_exits_2_before_any_run_folder_exists(tmp_path) -> None:
    """The machine check runs as a Hydra callback before Hydra creates the run folder (an
    exception there would be only a warning to Hydra: the callback exits 2 itself)."""
    import os
    import subprocess
    import sys

    from frlab.run.machine import gpu_visible

    if gpu_visible():
        pytest.skip("this machine has a GPU")
    logs = tmp_path / "logs"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HYDRA_FULL_ERROR": "0"}
    cmd = [sys.executable, "-m", "frlab", "experiment=qwen_math_1p5b", f"paths.log_dir={logs}"]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "config key `trainer.accelerator`" in out.stderr and "no GPU" in out.stderr
    assert "UserWarning" not in out.stderr
    assert list(tmp_path.iterdir()) == []  # no run folder, no outputs/ in the working dir
