"""The Python-tool sandbox against hostile code that looks out: it must not read the host's
secrets or directories, write outside its work dir, reach the network or gain privileges.

Tests that rely on namespaces skip in plain mode (`needs_namespace`, helpers.sandbox).
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
from pathlib import Path

import pytest
from helpers.sandbox import needs_namespace

import envs
from envs.python_tool import run_python


def test_environment_is_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    token = "frlab-secret-" + secrets.token_hex(8)
    monkeypatch.setenv("FRLAB_TEST_SECRET", token)
    monkeypatch.setenv("HF_TOKEN", token)
    r = run_python("import os\nprint(dict(os.environ))\nprint(open('/proc/self/environ').read())")
    assert r.exit_code == 0 and "PATH" in r.stdout
    assert token not in r.stdout + r.stderr


@needs_namespace
def test_host_process_environments_are_invisible(monkeypatch: pytest.MonkeyPatch) -> None:
    token = "frlab-secret-" + secrets.token_hex(8)
    monkeypatch.setenv("FRLAB_TEST_SECRET", token)  # our /proc/<pid>/environ keeps the old env
    os.environ["FRLAB_TEST_SECRET"] = token
    code = (
        "import os\n"
        f"for pid in ('1', '{os.getpid()}', '{os.getppid()}'):\n"
        "    try:\n"
        "        print(open(f'/proc/{pid}/environ').read())\n"
        "    except OSError as exc:\n"
        "        print('denied', exc)\n"
        "print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
    )
    r = run_python(code)
    assert r.exit_code == 0 and token not in r.stdout + r.stderr


@needs_namespace
def test_writes_outside_the_workdir_do_not_reach_the_host(tmp_path: Path) -> None:
    token = secrets.token_hex(8)
    targets = [
        tmp_path / f"pwn_{token}",
        Path(envs.__file__).parent / f"pwn_{token}",
        Path("/etc") / f"pwn_{token}",
        Path("/var/tmp") / f"pwn_{token}",
    ]
    code = "import os\n" + "".join(
        f"try:\n    open({str(t)!r}, 'w').write('x')\n    print('wrote', {str(t)!r})\n"
        "except OSError as exc:\n    print('blocked', exc)\n"
        for t in targets
    )
    try:
        r = run_python(code)
        assert r.exit_code == 0, r.stderr
        assert not any(t.exists() for t in targets)
    finally:
        for t in targets:
            t.unlink(missing_ok=True)


@needs_namespace
def test_host_directories_are_hidden() -> None:
    this_file = Path(__file__).resolve()
    code = (
        "import os\n"
        f"for path in ('/work', '/home', '/tmp', {str(this_file.parent)!r}):\n"
        "    print(path, sorted(os.listdir(path)) if os.path.isdir(path) else 'absent')\n"
        f"print(open({str(this_file)!r}).read())\n"
    )
    r = run_python(code)
    assert "FileNotFoundError" in r.stderr
    assert "test_host_directories_are_hidden" not in r.stdout
    assert "/work absent" in r.stdout and "/home absent" in r.stdout
    assert f"{this_file.parent} absent" in r.stdout
    tmp_line = r.stdout.splitlines()[2]  # /tmp holds the work dir alone
    assert tmp_line.startswith("/tmp ['frlab-py-") and tmp_line.count(",") == 0, tmp_line


@needs_namespace
def test_any_unlisted_top_level_entry_is_hidden() -> None:
    """Allowlist, not denylist: a checkout or secret mounted at an unusual top-level path
    (CI clones to /check/...) must be invisible too."""
    token = secrets.token_hex(6)
    probe_dir, probe_file = Path(f"/frlab-probe-{token}"), Path(f"/frlab-probe-{token}.txt")
    probe_dir.mkdir()
    try:
        (probe_dir / "secret.txt").write_text(f"dir-secret-{token}")
        probe_file.write_text(f"file-secret-{token}")
        code = (
            f"import os\nprint(os.path.lexists({str(probe_dir)!r}), "
            f"os.path.lexists({str(probe_file)!r}))\n"
            f"open({str(probe_dir / 'secret.txt')!r})\n"
        )
        r = run_python(code)
        assert r.stdout == "False False\n", (r.stdout, r.stderr)
        assert "FileNotFoundError" in r.stderr
        assert token not in r.stdout.replace(str(probe_dir), "").replace(str(probe_file), "")
    finally:
        probe_file.unlink(missing_ok=True)
        (probe_dir / "secret.txt").unlink(missing_ok=True)
        probe_dir.rmdir()


@needs_namespace
def test_network_is_cut() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.setblocking(False)
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            f"socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "print('CONNECTED')\n"
        )
        r = run_python(code, timeout_s=5)
        assert "CONNECTED" not in r.stdout and r.exit_code == 1
        assert "OSError" in r.stderr or "unreachable" in r.stderr
        with pytest.raises(BlockingIOError):
            server.accept()


@needs_namespace
def test_runs_unprivileged_without_new_privileges() -> None:
    code = (
        "import os\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "print(os.getuid(), os.geteuid(), status['NoNewPrivs'].strip(), status['CapEff'].strip())\n"
    )
    r = run_python(code)
    uid, euid, no_new_privs, caps = r.stdout.split()
    assert int(uid) == int(euid) and int(uid) != 0 and uid != str(os.getuid())
    assert no_new_privs == "1" and int(caps, 16) == 0


NAMESPACE_PROBE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    result = getattr(libc, name)(*args)
    return "ok" if result >= 0 else os.strerror(ctypes.get_errno())
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET, SIGCHLD = 0x10000000, 0x00020000, 0x40000000, 17
print("unshare", call("unshare", CLONE_NEWUSER | CLONE_NEWNS))
print("unshare_net", call("unshare", CLONE_NEWNET))
print("setns", call("setns", 0, 0))
print("clone", call("syscall", 56, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0))
print("clone3", call("syscall", 435, 0, 0))
print("mount", call("mount", b"tmpfs", b".", b"tmpfs", 0, b"size=200m"))
pid = os.fork()
if pid == 0:
    os._exit(7)
print("fork", os.WEXITSTATUS(os.waitpid(pid, 0)[1]))
"""
REFUSED = {
    "unshare": "Operation not permitted",
    "unshare_net": "Operation not permitted",
    "setns": "Operation not permitted",
    "clone": "Operation not permitted",
    "clone3": "Function not implemented",
    "fork": "7",
}


@needs_namespace
def test_new_namespaces_are_refused() -> None:
    """unshare(CLONE_NEWUSER|CLONE_NEWNS) used to succeed (uid 0 in a new user namespace, then
    a tmpfs past the disk cap); the seccomp filter refuses every namespace call, while plain
    fork (clone without CLONE_NEW* flags) still works."""
    r = run_python(NAMESPACE_PROBE)
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert {k: lines.get(k) for k in REFUSED} == REFUSED, (r.stdout, r.stderr)
    assert lines["mount"] == "Operation not permitted"


def test_plain_mode_refuses_new_namespaces_too() -> None:
    r = run_python(NAMESPACE_PROBE, mode="plain")
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert {k: lines.get(k) for k in REFUSED} == REFUSED, (r.stdout, r.stderr)


@needs_namespace
def test_mountinfo_shows_no_host_path() -> None:
    """The program's mount table lists only the sandbox's own root: no checkout, data or tool
    mount of the host (the repository's own path included)."""
    r = run_python("print(open('/proc/self/mountinfo').read())")
    assert r.exit_code == 0, r.stderr
    points = [line.split()[4] for line in r.stdout.splitlines() if line.strip()]
    prefix = os.path.realpath(sys.base_prefix)
    allowed = {"/", "/usr", "/etc", "/proc", prefix} | {
        f"/dev/{n}" for n in ("null", "zero", "full", "random", "urandom")
    }
    extra = [p for p in points if p not in allowed and not p.startswith("/tmp/frlab-py-")]
    assert extra == [], extra
    repo = str(Path(envs.__file__).resolve().parents[1])
    assert repo not in r.stdout
