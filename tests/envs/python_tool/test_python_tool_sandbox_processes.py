"""The Python-tool sandbox against hostile processes: no process the program starts outlives the
call (background children, fork bombs, a SIGKILLed caller), and it cannot kill its caller.

Tests that rely on namespaces skip in plain mode (`needs_namespace`, helpers.sandbox).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.sandbox import needs_namespace

import envs
from envs.python_tool import run_python, sandbox_mode


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
    bomb = (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass  "
        f"# {token}"
    )
    code = f"import os, sys\nos.execv(sys.executable, [sys.executable, '-c', {bomb!r}])"
    r = run_python(code, timeout_s=1, max_processes=16)
    assert r.timed_out
    assert procs_with(token) == []


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
        [sys.executable, "-c", _caller_script(program, mode)],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
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
