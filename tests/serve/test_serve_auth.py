"""`python -m frlab.serve`'s secure default: it reads the fleet secret as a vLLM fleet server
does (its flags first), and without one it listens on loopback only unless told otherwise."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from frlab.rollout.remote import auth
from frlab.serve.__main__ import parse_args, server_digest

SECRET = "serve-secret-" + "z" * 30
BASE = ["--model-config", "configs/model/toy_qwen2.yaml"]


@pytest.fixture(autouse=True)
def no_fleet_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (auth.SECRET_FILE_VAR, auth.SECRET_ENV_VAR, auth.DEFAULT_SECRET_ENV):
        monkeypatch.delenv(name, raising=False)


def test_off_loopback_without_a_secret_it_refuses_to_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    for host in ("0.0.0.0", "10.0.0.7", "::"):
        with pytest.raises(SystemExit, match="--allow-unauthenticated"):
            server_digest(parse_args([*BASE, "--host", host]))
    with caplog.at_level(logging.WARNING):
        allowed = server_digest(
            parse_args([*BASE, "--host", "10.0.0.7", "--allow-unauthenticated"])
        )
    assert allowed is None and "without a fleet secret" in caplog.text
    for host in ("127.0.0.1", "localhost", "::1"):  # loopback: as before
        assert server_digest(parse_args([*BASE, "--host", host])) is None


def test_it_reads_the_secret_from_its_flags_or_the_fleet_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "fleet.secret"
    path.write_text(SECRET)
    path.chmod(0o600)
    digest = auth.digest(SECRET)
    assert (
        server_digest(parse_args([*BASE, "--host", "10.0.0.7", "--secret-file", str(path)]))
        == digest
    )
    monkeypatch.setenv("MY_SECRET", SECRET)
    assert server_digest(parse_args([*BASE, "--secret-env", "MY_SECRET"])) == digest
    monkeypatch.setenv(auth.SECRET_FILE_VAR, str(path))
    assert server_digest(parse_args(BASE)) == digest
    path.write_text("short")
    with pytest.raises(SystemExit, match="at least 16") as info:
        server_digest(parse_args(BASE))
    assert "short" not in str(info.value)
