"""The Python-tool sandbox against hostile code: it must not outlive the call, escape its
directory, read the host's secrets, reach the network or kill its caller; and it never raises.

Hostile tests that rely on namespaces skip in plain mode (not root / no unshare), whose limits
the sandbox docstring states.
"""

from __future__ import annotations

import errno
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import envs
from envs.python_tool import run_python, sandbox_mode

needs_namespace = pytest.mark.skipif(
    sandbox_mode() != "namespace", reason="namespace sandbox needs root and util-linux unshare"
)


def procs_with(token: str) -> list[int]:
    """Pids (other than ours) whose command line contains `token`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline:
            found.append(int(entry))
    return found


def test_runs_code_and_reports_exit_status() -> None:
    r = run_python("import sys\nprint(6 * 7)\nprint('oops', file=sys.stderr)\nsys.exit(3)")
    assert (r.stdout, r.stderr, r.exit_code) == ("42\n", "oops\n", 3)
    assert not r.timed_out and not r.truncated


def test_errors_come_back_as_text() -> None:
    r = run_python("def f(:\n  pass")
    assert r.exit_code == 1 and "SyntaxError" in r.stderr
    r = run_python("1 / 0")
    assert r.exit_code == 1 and "ZeroDivisionError" in r.stderr


def test_never_raises_on_bad_arguments() -> None:
    r = run_python(None)  # type: ignore[arg-type]
    assert r.exit_code == -1 and "code must be a str" in r.stderr
    r = run_python("print(1)", timeout_s=0)
    assert r.exit_code == -1 and "timeout_s" in r.stderr


def test_infinite_loop_times_out() -> None:
    r = run_python("print('start', flush=True)\nwhile True:\n    pass", timeout_s=1)
    assert r.timed_out and r.exit_code == -9 and r.stdout == "start\n"


def test_output_is_capped_exactly() -> None:
    r = run_python("import sys\nsys.stdout.write('a' * 5000)", max_output_chars=100)
    assert r.stdout == "a" * 100 and r.truncated and not r.timed_out


def test_endless_output_is_capped_and_killed() -> None:
    r = run_python("while True:\n    print('x' * 1000)", timeout_s=1, max_output_chars=50)
    assert r.timed_out and r.truncated and len(r.stdout) == 50


def test_memory_bomb_hits_the_address_space_limit() -> None:
    r = run_python("x = bytearray(1024 ** 3)\nprint('allocated')", memory_mb=256)
    assert r.exit_code == 1 and "MemoryError" in r.stderr and "allocated" not in r.stdout
    grow = "chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))"
    r = run_python(grow, memory_mb=256, timeout_s=2)
    assert "MemoryError" in r.stderr and not r.timed_out


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


def test_workdir_is_fresh_and_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    code = "import os\nopen('out.txt', 'w').write('x' * 100)\nprint(os.getcwd())\nprint(os.listdir('.'))"
    r = run_python(code)
    assert r.exit_code == 0, r.stderr
    cwd, listing = r.stdout.splitlines()
    assert cwd.startswith(str(root)) and "out.txt" in listing
    assert list(root.iterdir()) == []


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


def test_proc_scan_finds_a_tokened_process() -> None:
    """Control for the leak checks below: `procs_with` does see a live process."""
    token = "frlab-probe-" + secrets.token_hex(6)
    child = f"import time; print('ready', flush=True); time.sleep(30)  # {token}"
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        assert procs_with(token) == [proc.pid]
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


@needs_namespace
def test_background_children_die_with_the_call() -> None:
    token = "frlab-bg-" + secrets.token_hex(6)
    orphan = (
        "import os, time\nif os.fork():\n    os._exit(0)\nos.setsid()\nif os.fork():\n"
        f"    os._exit(0)\ntime.sleep(60)  # {token}"
    )
    code = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', {orphan!r}], start_new_session=True)\n"
        "p.wait()\n"
        "time.sleep(0.3)\n"
        "print('spawned', p.returncode)\n"
    )
    r = run_python(code, timeout_s=5)
    assert r.stdout == "spawned 0\n", r.stderr
    assert procs_with(token) == []


@needs_namespace
def test_fork_bomb_is_contained() -> None:
    token = "frlab-bomb-" + secrets.token_hex(6)
    bomb = f"import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass  # {token}"
    code = f"import os, sys\nos.execv(sys.executable, [sys.executable, '-c', {bomb!r}])"
    r = run_python(code, timeout_s=1, max_processes=16)
    assert r.timed_out
    assert procs_with(token) == []


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
def test_cannot_kill_its_caller_or_host_processes() -> None:
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        code = (
            "import os, signal\n"
            f"for pid in (os.getppid(), 1, {os.getpid()}, {bystander.pid}, -1):\n"
            "    try:\n"
            "        os.kill(pid, signal.SIGKILL)\n"
            "    except OSError as exc:\n"
            "        print(pid, type(exc).__name__)\n"
            "print('still here')\n"
        )
        r = run_python(code)
        assert r.stdout.endswith("still here\n"), r.stderr
        assert bystander.poll() is None  # the host process survived
    finally:
        bystander.send_signal(signal.SIGKILL)
        bystander.wait()


def test_plain_mode_still_times_out_and_caps() -> None:
    r = run_python(
        "while True:\n    print('y' * 100)", timeout_s=1, max_output_chars=30, mode="plain"
    )
    assert r.timed_out and r.truncated and r.stdout == "y" * 30
    r = run_python("print(sum(range(10)))", mode="plain")
    assert (r.stdout, r.exit_code) == ("45\n", 0)


@needs_namespace
def test_disk_use_is_capped() -> None:
    code = (
        "chunk = b'x' * 2 ** 20\n"
        "for name in ('a', 'b'):\n"
        "    try:\n"
        "        with open(name, 'wb') as f:\n"
        "            for _ in range(40):\n"
        "                f.write(chunk)\n"
        "        print(name, 'complete')\n"
        "    except OSError as exc:\n"
        "        print(name, 'stopped', exc.errno)\n"
    )
    r = run_python(code, max_file_mb=16, disk_mb=24)
    # file "a" hits the 16 MiB file-size limit (EFBIG); "b" fills the 24 MiB tmpfs (ENOSPC)
    assert r.stdout == f"a stopped {errno.EFBIG}\nb stopped {errno.ENOSPC}\n", r.stderr


def test_concurrent_calls_from_threads_stay_separate() -> None:
    from concurrent.futures import ThreadPoolExecutor

    codes = [
        f"import os\nopen('mine', 'w').write('{i}')\nprint(open('mine').read())" for i in range(4)
    ]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run_python, codes))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)]


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


def test_fatal_signal_is_reported_as_negative_exit_code() -> None:
    r = run_python(
        "import os, signal\nprint('bye', flush=True)\nos.kill(os.getpid(), signal.SIGSEGV)"
    )
    assert (r.stdout, r.exit_code, r.timed_out) == ("bye\n", -signal.SIGSEGV, False)


@needs_namespace
def test_child_holding_the_pipes_does_not_outlive_its_parent() -> None:
    token = "frlab-pipe-" + secrets.token_hex(6)
    code = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)  # {token}'])\n"
        "print('parent done')\n"
    )
    r = run_python(code, timeout_s=5)
    assert (r.stdout, r.exit_code, r.timed_out) == ("parent done\n", 0, False)
    assert procs_with(token) == []


def descendants(pid: int) -> list[int]:
    """Pids of every live descendant of `pid` (walks /proc ppid links)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[-1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


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
    allowed = {"/", "/usr", "/etc", "/proc", prefix} | {f"/dev/{n}" for n in
               ("null", "zero", "full", "random", "urandom")}  # fmt: skip
    extra = [p for p in points if p not in allowed and not p.startswith("/tmp/frlab-py-")]
    assert extra == [], extra
    repo = str(Path(envs.__file__).resolve().parents[1])
    assert repo not in r.stdout


def _caller_script(code: str, mode: str) -> str:
    return (
        "import sys\n"
        "from envs.python_tool import run_python\n"
        "print('calling', flush=True)\n"
        f"run_python({code!r}, timeout_s=120, mode={mode!r})\n"
    )


@pytest.mark.parametrize("mode", ["namespace", "plain"])
def test_the_program_dies_with_a_sigkilled_caller(mode: str) -> None:
    if mode == "namespace" and sandbox_mode() != "namespace":
        pytest.skip("namespace sandbox needs root and util-linux unshare")
    token = "frlab-orphan-" + secrets.token_hex(6)
    program = f"import time\nprint('up', flush=True)\ntime.sleep(120)  # {token}"
    env = {**os.environ, "PYTHONPATH": str(Path(envs.__file__).resolve().parents[1])}
    caller = subprocess.Popen(
        [sys.executable, "-c", _caller_script(program, mode)], stdout=subprocess.PIPE,
        env=env, text=True,
    )  # fmt: skip
    try:
        assert caller.stdout.readline() == "calling\n"
        deadline = time.monotonic() + 30
        while not procs_with(token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert procs_with(token), "the sandboxed program never started"
        family = descendants(caller.pid)
    finally:
        caller.kill()
        caller.wait()
        caller.stdout.close()
    # The kernel tears a dead caller's PID namespace down asynchronously (SIGKILL to every
    # member once its init is gone): wait for the family AND the program, with a deadline.
    deadline = time.monotonic() + 10
    while (any(alive(p) for p in family) or procs_with(token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in family if alive(p)] == []
    assert procs_with(token) == []
