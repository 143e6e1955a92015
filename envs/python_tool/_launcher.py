"""Sandbox launcher: runs inside the sandbox before the untrusted code (stdlib only).

`run_python` (envs.python_tool.sandbox) starts this script as `python -I -S _launcher.py SPEC`
where SPEC is a JSON object. Two modes:

- "namespace" (root, under `unshare --fork --pid --mount-proc --net --ipc --uts --kill-child`):
  this process is PID 1 of a fresh PID namespace. It hides host directories under empty tmpfs
  mounts, re-exposes the interpreter's prefix read-only, mounts a size-capped tmpfs on the work
  directory, then forks the untrusted program with rlimits and no_new_privs under a fresh
  unprivileged uid/gid.
  It reaps orphans and exits with the program's status; the kernel then SIGKILLs every process
  left in the namespace (double-forked or setsid'd children included).
- "plain" (fallback): set rlimits and exec the program in place (no namespaces, same uid).

Exit status: the program's exit code, or 128 + signal when a signal killed it; 125 when the
sandbox could not be set up (the reason goes to stderr).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
SETUP_FAILED = 125
PR_SET_NO_NEW_PRIVS = 38


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    args = [None if x is None else x.encode() for x in (source, target, fstype, data)]
    if libc.mount(args[0], args[1], args[2], ctypes.c_ulong(flags), args[3]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype or 'bind'} on {target}: {os.strerror(err)}")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _paths_to_hide(spec: dict) -> list[str]:
    """Every top-level entry of / outside the allowlist, then the extra subdirectories."""
    keep = set(spec["keep"])
    top = ["/" + name for name in sorted(os.listdir("/"))]
    return [p for p in top if p not in keep and not os.path.islink(p)] + spec["hide_also"]


def _hide_host_dirs(spec: dict) -> None:
    """Cover host directories with empty root-owned tmpfs (files with /dev/null); keep the
    interpreter reachable."""
    prefix = spec["prefix"]
    prefix_fd = os.open(prefix, os.O_PATH | os.O_DIRECTORY)
    hidden = []
    for path in _paths_to_hide(spec):
        if os.path.islink(path):
            continue
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
            hidden.append(path)
        elif os.path.isfile(path):
            _mount("/dev/null", path, None, MS_BIND, None)
    if any(_under(prefix, h) for h in hidden):
        os.makedirs(prefix, exist_ok=True)
        _mount(f"/proc/self/fd/{prefix_fd}", prefix, None, MS_BIND | MS_REC, None)
        _mount("", prefix, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
    os.close(prefix_fd)


def _set_limits(spec: dict) -> None:
    limits = {
        resource.RLIMIT_AS: spec["as_bytes"],
        resource.RLIMIT_CPU: spec["cpu_s"],
        resource.RLIMIT_FSIZE: spec["fsize_bytes"],
        resource.RLIMIT_NOFILE: spec["nofile"],
        resource.RLIMIT_CORE: 0,
    }
    if spec.get("nproc") is not None:
        limits[resource.RLIMIT_NPROC] = spec["nproc"]
    for which, value in limits.items():
        resource.setrlimit(which, (value, value))


def _no_new_privs() -> None:
    """prctl(PR_SET_NO_NEW_PRIVS): setuid/setcap binaries cannot raise privileges after exec."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def _exec_program(spec: dict) -> None:
    os.chdir(spec["workdir"])
    exe = spec["python"]
    os.execve(exe, [exe, "-I", "-S", "-u", "main.py"], spec["env"])


def _run_child(spec: dict) -> None:
    """In the forked child: drop to the sandbox uid, apply limits, exec. Never returns."""
    try:
        uid = spec["uid"]
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        _set_limits(spec)
        _no_new_privs()
        _exec_program(spec)
    except BaseException as exc:  # noqa: BLE001 - report and die, whatever happened
        os.write(2, f"sandbox: could not start the program: {exc!r}\n".encode())
    os._exit(SETUP_FAILED)


def _status_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _namespace_main(spec: dict) -> int:
    workdir = spec["workdir"]
    with open(os.path.join(workdir, "main.py"), "rb") as f:
        code = f.read()
    os.umask(0o022)
    _hide_host_dirs(spec)
    os.makedirs(workdir, exist_ok=True)
    size = f"size={spec['tmpfs_bytes']},mode=700"
    _mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, size)
    os.chown(workdir, spec["uid"], spec["uid"])
    with open(os.path.join(workdir, "main.py"), "wb") as f:
        f.write(code)
    sys.stdout.flush()
    child = os.fork()
    if child == 0:
        _run_child(spec)
    while True:  # PID 1: reap orphans until the program itself exits
        pid, status = os.wait()
        if pid == child:
            return _status_code(status)


def main() -> None:
    spec = json.loads(sys.argv[1])
    try:
        if spec["mode"] == "namespace":
            os._exit(_namespace_main(spec))
        _set_limits(spec)
        _exec_program(spec)
    except BaseException as exc:  # noqa: BLE001 - the caller reads the reason as text
        os.write(2, f"sandbox: setup failed: {exc!r}\n".encode())
    os._exit(SETUP_FAILED)


if __name__ == "__main__":
    main()
