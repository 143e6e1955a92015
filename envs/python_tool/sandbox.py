"""Run untrusted Python for the tool-using agent: `run_python(code, ...)`.

The FlashREINFORCE paper's Python-tool setting runs model-written code in an isolated
interpreter; errors come back as text and the tool never raises.

Threat model: the code is written by an adversary that wants to outlive the call, escape its
directory, read the host's secrets, reach the network or kill its caller. What the sandbox does:

Always (both modes)
- A fresh interpreter, `python -I -S -u` (isolated: no site-packages, no user site, PYTHON*
  variables ignored), the base interpreter of the running Python, stdlib only.
- A fresh temp dir (tempfile.mkdtemp) as the working directory, removed afterwards; HOME and
  TMPDIR point at it. The environment is rebuilt from scratch: no host variable (HF tokens,
  API keys) is passed on.
- Its own session (start_new_session); on timeout, and after every call, everything is
  SIGKILLed (namespace mode: the namespace's PID 1, which takes the namespace down; then the
  process group). stdin is /dev/null.
- rlimits: address space (memory_mb), CPU seconds (ceil(timeout_s) + 1), file size, open files,
  no core dumps.
- Output read while the program runs, through a selector, keeping at most max_output_chars per
  stream: unbounded output never sits in memory. Errors come back as text: run_python never
  raises.

Namespace mode (running as root with util-linux `unshare`; probed once, else plain mode)
- New PID, mount, network, IPC and UTS namespaces (`unshare --fork --pid --mount-proc --net
  --ipc --uts --kill-child`). The launcher is PID 1: when the program exits, or when we kill
  the group on timeout, the kernel SIGKILLs every process in the namespace, including children
  that double-forked or called setsid. Host processes are invisible (own /proc), so the program
  cannot signal the caller or read other processes' environments.
- Network: the new namespace has only a down loopback interface; no connection leaves it.
- The program runs under a fresh random unprivileged uid/gid with no capabilities and
  no_new_privs (setuid binaries such as su or mount cannot raise privileges), so RLIMIT_NPROC
  (counted per real uid; ignored for root, hence the uid switch) really caps the number of
  processes and threads, and root-owned files are read-only to it.
- A minimal root file system: the launcher pivots into a small root-owned tmpfs holding only
  read-only binds of /usr, /bin, /sbin, /lib*, /etc and the interpreter's prefix, the device
  nodes null, zero, full, random and urandom, the namespace's own /proc, and the work dir (a
  tmpfs of disk_mb, the only place the program can write); the host's tree is detached. No
  other host directory (/root, /home, /tmp, /var, /opt, /sys, /dev/shm, or a checkout or data
  mount such as /work or /check) exists for the program, and /proc/self/mountinfo lists only
  these mounts.
- A seccomp filter refuses every way of creating or entering a namespace (unshare, setns,
  clone with a CLONE_NEW* flag; clone3 answers ENOSYS so the C library falls back to clone):
  without it an unprivileged program could make a user namespace, be root inside it and mount
  a tmpfs past the disk cap. The plain mode installs the same filter.
- The program dies with its caller: the launcher (the namespace's PID 1) watches a pipe whose
  write end only the caller holds; when the caller dies, even by SIGKILL, the pipe reads EOF,
  PID 1 exits and the kernel kills the namespace.

Not covered (be aware)
- World-readable files under the kept directories (/etc, /usr, ...) stay readable, and so
  does the interpreter's prefix with its site-packages (read-only); files with mode 0600/0640
  owned by root do not. A host with world-writable directories other than those hidden would
  leave them writable. /proc is the namespace's own, but host-wide kernel files in it
  (/proc/meminfo, /proc/cpuinfo, /proc/sys) stay readable.
- The seccomp filter covers namespaces only: every other system call is available to an
  unprivileged user (kernel bugs are out of scope). No cgroup: memory is capped per process
  (RLIMIT_AS), so a program can hold up
  to max_processes x memory_mb in total; CPU time is capped per process, wall time by the
  timeout. Size max_processes and memory_mb for the host's RAM and the number of concurrent
  calls.
- Plain mode (not root, or `unshare` unusable): no namespaces and the caller's uid. The program
  can read whatever the caller can, reach the network, signal the caller's other processes (it
  could kill its caller with kill(-1, SIGKILL)), and a child that calls setsid escapes the group
  kill (we also kill the processes left in the session, but not those that left it). The
  program gets SIGKILL when its caller's thread dies (a parent-death signal), its children
  do not.
  RLIMIT_NPROC is not set there (it would count all the caller's processes). Use it only on a
  throwaway machine or container; `sandbox_mode()` tells which mode is in use.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

LAUNCHER = Path(__file__).with_name("_launcher.py")
# Allowlist, not denylist: only these top-level entries exist in the sandbox's root (a host may
# mount a checkout or secrets anywhere: /check, /data, /old_root ...), read-only, plus the
# interpreter's prefix, a few device nodes, /proc and the work dir.
KEPT_ROOT_ENTRIES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
UNSHARE_FLAGS = ("--fork", "--pid", "--mount-proc", "--net", "--ipc", "--uts", "--kill-child")
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
READ_CHUNK = 65536
NAMESPACE_REAP_S = 10.0
TIMEOUT_EXIT_CODE = -int(signal.SIGKILL)


@dataclass(frozen=True)
class PythonResult:
    """The outcome of one run: captured (capped) output and how the program ended.

    exit_code: the program's exit status; negative -N when signal N killed it (-9 on timeout);
    -1 with the reason in stderr when the sandbox itself failed.
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    truncated: bool


@dataclass(frozen=True)
class Limits:
    """Resource limits for one run (validated: each must be positive)."""

    timeout_s: float = 10.0
    memory_mb: int = 1024
    max_output_chars: int = 2048
    max_processes: int = 32
    max_file_mb: int = 16
    max_open_files: int = 64
    disk_mb: int = 64

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"python tool: {name} must be a positive number, got {value!r}")


def _interpreter() -> tuple[str, str]:
    """The base interpreter (not a venv shim) and its prefix."""
    exe = getattr(sys, "_base_executable", None) or sys.executable
    return os.path.realpath(exe), os.path.realpath(sys.base_prefix)


def _spec(mode: str, workdir: str, limits: Limits, watch_fd: int | None = None) -> dict:
    python, prefix = _interpreter()
    env = {**BASE_ENV, "HOME": workdir, "TMPDIR": workdir, "PYTHONDONTWRITEBYTECODE": "1"}
    return {
        "mode": mode,
        "workdir": workdir,
        "python": python,
        "prefix": prefix,
        "keep": list(KEPT_ROOT_ENTRIES),
        "uid": 100_000 + secrets.randbelow(1_000_000_000),
        "as_bytes": int(limits.memory_mb) * 2**20,
        "cpu_s": math.ceil(limits.timeout_s) + 1,
        "fsize_bytes": int(limits.max_file_mb) * 2**20,
        "nofile": int(limits.max_open_files),
        "nproc": int(limits.max_processes) if mode == "namespace" else None,
        "tmpfs_bytes": int(limits.disk_mb) * 2**20,
        "env": env,
        "watch_fd": watch_fd,
    }


def _command(mode: str, spec: dict) -> list[str]:
    launcher = [spec["python"], "-I", "-S", str(LAUNCHER), json.dumps(spec)]
    if mode == "namespace":
        return [shutil.which("unshare") or "unshare", *UNSHARE_FLAGS, *launcher]
    return launcher


class _CappedReader:
    """Drain a pipe, keeping only the first `max_chars` characters (as UTF-8 bytes)."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.max_bytes = 4 * max_chars  # UTF-8: at most 4 bytes per character
        self.data = bytearray()
        self.dropped = False

    def feed(self, chunk: bytes) -> None:
        room = self.max_bytes - len(self.data)
        if len(chunk) > room:
            self.dropped = True
        self.data += chunk[: max(room, 0)]

    def text(self) -> tuple[str, bool]:
        decoded = self.data.decode("utf-8", errors="replace")
        cut = len(decoded) > self.max_chars
        return decoded[: self.max_chars], self.dropped or cut


def _pump(proc: subprocess.Popen, readers: dict, deadline: float) -> bool:
    """Read both pipes until EOF or the deadline; True when the deadline passed."""
    with selectors.DefaultSelector() as sel:
        for pipe, reader in readers.items():
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe, selectors.EVENT_READ, reader)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            for key, _ in sel.select(remaining):
                try:
                    chunk = os.read(key.fd, READ_CHUNK)
                except BlockingIOError:
                    continue
                if chunk:
                    key.data.feed(chunk)
                else:
                    sel.unregister(key.fileobj)
    remaining = deadline - time.monotonic()
    try:
        proc.wait(timeout=max(remaining, 0.0))
    except subprocess.TimeoutExpired:
        return True
    return False


def _session_members(sid: int) -> list[int]:
    """Pids of processes whose session id is `sid` (read from /proc; plain-mode cleanup)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 3 and int(fields[3]) == sid:
            members.append(int(entry))
    return members


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _kill_namespace(proc: subprocess.Popen) -> None:
    """SIGKILL the namespace's PID 1 and let `unshare` reap it: the kernel kills every process
    in the namespace and PID 1 is reaped only once they are all gone, so when `unshare` exits
    nothing of the program is left."""
    for pid in _children(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=NAMESPACE_REAP_S)
    except subprocess.TimeoutExpired:
        pass


def _kill_all(proc: subprocess.Popen, mode: str) -> None:
    """SIGKILL the session's process group (and, in plain mode, the session's stragglers)."""
    if mode == "namespace" and proc.poll() is None:
        _kill_namespace(proc)
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    if mode == "plain":
        for pid in _session_members(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _exit_code(returncode: int, timed_out: bool) -> int:
    if timed_out:
        return TIMEOUT_EXIT_CODE
    if returncode > 128:
        return -(returncode - 128)  # the launcher reports a fatal signal N as 128 + N
    return returncode


def _run(code: str, limits: Limits, mode: str) -> PythonResult:
    workdir = tempfile.mkdtemp(prefix="frlab-py-")
    watch_r, watch_w = os.pipe()  # the launcher sees EOF on watch_r when this process dies
    try:
        Path(workdir, "main.py").write_text(code, encoding="utf-8", errors="surrogatepass")
        spec = _spec(mode, workdir, limits, watch_r if mode == "namespace" else None)
        proc = subprocess.Popen(
            _command(mode, spec),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(BASE_ENV),
            cwd=workdir,
            start_new_session=True,
            pass_fds=(watch_r,) if mode == "namespace" else (),
        )
        os.close(watch_r)
        watch_r = -1
        out, err = _CappedReader(limits.max_output_chars), _CappedReader(limits.max_output_chars)
        try:
            timed_out = _pump(proc, {proc.stdout: out, proc.stderr: err}, _deadline(limits))
        finally:
            _kill_all(proc, mode)
            proc.stdout.close()
            proc.stderr.close()
        (stdout, cut_out), (stderr, cut_err) = out.text(), err.text()
        return PythonResult(
            stdout, stderr, _exit_code(proc.returncode, timed_out), timed_out, cut_out or cut_err
        )
    finally:
        for fd in (watch_r, watch_w):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)


def _deadline(limits: Limits) -> float:
    return time.monotonic() + float(limits.timeout_s)


@functools.lru_cache(maxsize=1)
def sandbox_mode() -> str:
    """ "namespace" when this host supports the namespace sandbox (root + unshare), else "plain"."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        log.warning("python tool: not root or no unshare; using the weaker plain sandbox")
        return "plain"
    probe = _run("print('ok')", Limits(timeout_s=30), "namespace")
    if probe.exit_code == 0 and probe.stdout.strip() == "ok":
        return "namespace"
    log.warning("python tool: namespace sandbox failed (%s); using plain mode", probe.stderr)
    return "plain"


def run_python(
    code: str,
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    max_output_chars: int = 2048,
    *,
    max_processes: int = 32,
    max_file_mb: int = 16,
    disk_mb: int = 64,
    mode: str | None = None,
) -> PythonResult:
    """Run `code` in the sandbox; never raises (sandbox failures come back in `stderr`).

    mode: "namespace" or "plain" to force one (tests); None picks `sandbox_mode()`.
    """
    try:
        if not isinstance(code, str):
            raise TypeError(f"python tool: code must be a str, got {type(code).__name__}")
        limits = Limits(
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            max_output_chars=max_output_chars,
            max_processes=max_processes,
            max_file_mb=max_file_mb,
            disk_mb=disk_mb,
        )
        chosen = mode or sandbox_mode()
        if chosen not in ("namespace", "plain"):
            raise ValueError(f"python tool: mode must be 'namespace' or 'plain', got {mode!r}")
        return _run(code, limits, chosen)
    except Exception as exc:  # the tool never raises into the rollout
        return PythonResult("", f"sandbox error: {exc!r}", -1, False, False)
