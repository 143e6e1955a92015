"""The launch recipes' fleet is closed to the network by default: each server listens on the
address the learner reaches it by (never 0.0.0.0), carries frlab's guard as its outermost
middleware and vLLM's own API-key guard, reads snapshots only from the run's snapshot folder,
and gets the fleet's secret as a file path (the learner too): the value is on no command line."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAUNCH = REPO / "scripts" / "launch"
SECRET = "0123456789abcdef" * 4
GUARD = "frlab.rollout.remote.auth.FleetGuard"


def bash(script: str, **env: str) -> subprocess.CompletedProcess:
    """`script` in bash with fleet.sh sourced, in the repository root."""
    full = {**os.environ, **env}
    return subprocess.run(
        ["bash", "-c", f"source scripts/launch/fleet.sh && {script}"],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


def recipe(script: str, *args: str, **env: str) -> list[str]:
    """The lines a recipe prints with PRINT_ONLY=1."""
    full = {**os.environ, "PRINT_ONLY": "1", "RUN_DIR": "/shared/run", **env}
    proc = subprocess.run(
        ["bash", str(LAUNCH / script), *args],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert SECRET not in proc.stdout + proc.stderr
    return proc.stdout.splitlines()


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.secret"
    path.write_text(SECRET)
    path.chmod(0o600)
    return path


def test_the_fleet_secret_is_created_once_private_and_never_printed(tmp_path: Path) -> None:
    path = tmp_path / "run" / "fleet.secret"
    first = bash(f"fleet_secret {shlex.quote(str(path))}")
    assert first.returncode == 0, first.stderr
    value = path.read_text()
    assert len(value) == 64 and int(value, 16) >= 0  # 32 random bytes as hex
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert value not in first.stdout + first.stderr
    again = bash(f"fleet_secret {shlex.quote(str(path))}")  # a resumed or requeued job
    assert again.returncode == 0 and path.read_text() == value


def test_single_node_servers_listen_where_the_learner_reaches_them_behind_the_guard(
    secret_file: Path,
) -> None:
    lines = recipe(
        "single_node.sh",
        "qwen_math_1p5b",
        HOST="10.1.2.3",
        FLEET_SECRET_FILE=str(secret_file),
        VLLM_EXTRA_ARGS="--middleware some.other.Middleware",
    )
    served = [shlex.split(x) for x in lines if " vllm serve " in x]
    assert len(served) == 3
    for words in served:
        # vLLM's --api-key guard gets the value from the file, through the environment
        assert words[0] == f"VLLM_API_KEY=$(< {secret_file})" and words[1] == "env"
        assert f"FRLAB_FLEET_SECRET_FILE={secret_file}" in words
        assert "FRLAB_SNAPSHOT_ROOT=/shared/run/snapshots" in words
        assert words[words.index("--host") + 1] == "10.1.2.3" and "0.0.0.0" not in words
        assert "--api-key" not in words
        middleware = [words[i + 1] for i, w in enumerate(words) if w == "--middleware"]
        assert middleware[-1] == GUARD  # added last by vLLM: the outermost, sees every request
    overrides = shlex.split(lines[-1])
    assert (
        "rollout.remote.servers=[http://10.1.2.3:8100,http://10.1.2.3:8101,http://10.1.2.3:8102]"
        in overrides
    )
    assert f"rollout.remote.secret_file={secret_file}" in overrides
    assert "rollout.remote.snapshot_dir=/shared/run/snapshots" in overrides


def test_by_default_the_secret_lives_in_the_run_folder_and_servers_on_loopback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FLEET_SECRET_FILE", raising=False)
    monkeypatch.delenv("HOST", raising=False)
    lines = recipe("single_node.sh", "r1_distill_1p5b")
    assert shlex.split(lines[0]) == ["fleet_secret", "/shared/run/fleet.secret"]
    server = shlex.split(next(x for x in lines if " vllm serve " in x))
    assert server[server.index("--host") + 1] == "127.0.0.1"
    assert "rollout.remote.secret_file=/shared/run/fleet.secret" in shlex.split(lines[-1])


def test_slurm_fleet_steps_listen_on_the_address_in_the_learners_urls(secret_file: Path) -> None:
    lines = recipe(
        "slurm_learner_fleet.sbatch",
        "python_tool_qwen7b",
        FRLAB_NODES="node0 node1",
        FLEET_SECRET_FILE=str(secret_file),
    )
    step = shlex.split(next(x for x in lines if "start_fleet" in x))[-1]
    assert "HOST='node1'" in step and f"FLEET_SECRET_FILE='{secret_file}'" in step
    assert "FLEET_SNAPSHOT_DIR='/shared/run/snapshots'" in step
    overrides = shlex.split(lines[-1])
    assert any(o.startswith("rollout.remote.servers=[http://node1:8100,") for o in overrides)
    assert f"rollout.remote.secret_file={secret_file}" in overrides


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"HOST": ""}, "set HOST"),
        ({"HOST": "0.0.0.0"}, "set HOST"),
        ({"HOST": "10.1.2.3", "FLEET_SECRET_FILE": ""}, "FLEET_SECRET_FILE"),
    ],
)
def test_a_server_without_an_address_or_a_secret_is_not_started(
    env: dict[str, str], message: str, secret_file: Path
) -> None:
    out = bash(
        "start_server 0 8100 m 1 64",
        PRINT_ONLY="1",
        **{"FLEET_SECRET_FILE": str(secret_file), **env},
    )
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_a_started_server_gets_the_secret_in_its_environment_never_in_its_arguments(
    tmp_path: Path, secret_file: Path
) -> None:
    """start_server for real, with a stand-in `vllm` command that records what it got."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "vllm"
    fake.write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {tmp_path}/args\nenv > {tmp_path}/env\n')
    fake.chmod(0o755)
    out = bash(
        "start_server 0 8100 m 1 64 && wait",
        VLLM_ENTRY="cli",
        HOST="127.0.0.1",
        FLEET_SECRET_FILE=str(secret_file),
        PATH=f"{bin_dir}:{os.environ['PATH']}",
    )
    assert out.returncode == 0, out.stderr
    args = (tmp_path / "args").read_text().splitlines()
    env = dict(
        line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line
    )
    assert SECRET not in "\n".join(args) and args[-2:] == ["--middleware", GUARD]
    assert env["VLLM_API_KEY"] == SECRET  # vLLM's own guard of /v1...
    assert env["FRLAB_FLEET_SECRET_FILE"] == str(secret_file)  # frlab's guard of every route
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
