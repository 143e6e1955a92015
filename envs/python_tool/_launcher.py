"""Sandbox launcher: runs inside the sandbox before the untrusted code (stdlib only).

`run_python` (envs.python_tool.sandbox) starts this script as `python -I -S _launcher.py SETTINGS`
where SETTINGS is a JSON object. Two modes:

- "namespace" (root, under `unshare --fork --pid --mount-proc --net --ipc --uts --kill-child`):
  this process is PID 1 of a fresh PID namespace. It builds a minimal root file system (a
  small tmpfs holding read-only binds of the kept system directories and the interpreter's
  prefix, a few device nodes, the namespace's own /proc and a size-capped tmpfs work dir),
  pivots into it and detaches the host's tree, so no host path stays reachable or listed in
  /proc/self/mountinfo. It then forks the untrusted program with rlimits, no_new_privs and a
  seccomp filter under a fresh unprivileged uid/gid, reaps orphans and exits with the
  program's status; the kernel then SIGKILLs every process left in the namespace
  (double-forked or setsid'd children included). It also watches a pipe whose write end only
  the caller holds: when the caller dies (even by SIGKILL) the pipe reads EOF and this PID 1
  exits, which takes the whole namespace down.
- "plain" (fallback): set rlimits, no_new_privs, the seccomp filter and a parent-death signal,
  then exec the program in place (no namespaces, same uid).

The seccomp filter refuses (EPERM) every way of making or entering a namespace: `unshare`,
`setns`, and `clone` with any CLONE_NEW* flag; `clone3` (whose flags sit behind a pointer a
filter cannot read) gets ENOSYS, so the C library falls back to `clone`. A new user namespace
would otherwise give the program root inside it, and with it mounts (e.g. a tmpfs past the
disk cap). System calls of another ABI (x32) are refused too; unknown architectures kill.

Exit status: the program's exit code, or 128 + signal when a signal killed it; 125 when the
sandbox could not be set up (the reason goes to stderr).
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import select
import signal
import struct
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
MS_PRIVATE, MNT_DETACH = 1 << 18, 2
SETUP_FAILED = 125
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 38, 22, 2
DEVICE_NODES = ("null", "zero", "full", "random", "urandom")
CALLER_GONE = 128 + int(signal.SIGKILL)

# Per architecture: (AUDIT_ARCH value, syscall numbers for unshare, setns, clone, clone3,
# pivot_root), from the kernel's unistd tables.
ARCHES = {
    "x86_64": (
        0xC000003E,
        {"unshare": 272, "setns": 308, "clone": 56, "clone3": 435, "pivot_root": 155},
    ),
    "aarch64": (
        0xC00000B7,
        {"unshare": 97, "setns": 268, "clone": 220, "clone3": 435, "pivot_root": 41},
    ),
}
X32_SYSCALL_BIT = 0x40000000
CLONE_NEW_FLAGS = 0x7E020080  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWTIME
RET_ALLOW, RET_ERRNO, RET_KILL = 0x7FFF0000, 0x00050000, 0x80000000
EPERM, ENOSYS = 1, 38


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    args = [None if x is None else x.encode() for x in (source, target, fstype, data)]
    result = _libc().mount(args[0], args[1], args[2], ctypes.c_ulong(flags), args[3])
    _check(result, f"mount {fstype or 'bind'} on {target}")


def _arch() -> tuple[int, dict[str, int]]:
    machine = platform.machine()
    if machine not in ARCHES:
        raise OSError(f"no seccomp filter for architecture {machine!r}")
    return ARCHES[machine]


def _seccomp_program() -> bytes:
    """The classic-BPF filter (struct sock_filter entries) described in the module docstring.

    Written with labels: each jump names its target and the offsets are computed here."""
    audit_arch, nr = _arch()
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    program: list[tuple[int, int, str | None, str | None]] = [
        (ld, 4, None, None),  # seccomp_data.arch
        (jeq, audit_arch, None, "kill"),
        (ld, 0, None, None),  # seccomp_data.nr
        (jge, X32_SYSCALL_BIT, "eperm", None),
        (jeq, nr["unshare"], "eperm", None),
        (jeq, nr["setns"], "eperm", None),
        (jeq, nr["clone3"], "enosys", None),
        (jeq, nr["clone"], None, "allow"),
        (ld, 16, None, None),  # low 32 bits of args[0]: clone's flags
        (jset, CLONE_NEW_FLAGS, "eperm", "allow"),
    ]
    labels = {
        "allow": RET_ALLOW,
        "eperm": RET_ERRNO | EPERM,
        "enosys": RET_ERRNO | ENOSYS,
        "kill": RET_KILL,
    }
    where = {name: len(program) + i for i, name in enumerate(labels)}
    out = []
    for pc, (code, k, jt, jf) in enumerate(program):
        off_t = 0 if jt is None else where[jt] - pc - 1
        off_f = 0 if jf is None else where[jf] - pc - 1
        out.append(struct.pack("HBBI", code, off_t, off_f, k))
    out += [struct.pack("HBBI", ret, 0, 0, value) for value in labels.values()]
    return b"".join(out)


def _install_seccomp() -> None:
    """Load the filter (needs no_new_privs or CAP_SYS_ADMIN); it survives execve."""
    program = _seccomp_program()
    buf = ctypes.create_string_buffer(program, len(program))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    libc = _libc()
    libc.prctl.argtypes = [
        ctypes.c_int,
        ctypes.c_ulong,
        ctypes.c_void_p,
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _bind_read_only(source: str, target: str) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "ab").close()
    _mount(source, target, None, MS_BIND | MS_REC, None)
    _mount("", target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None)


def _populate_root(spec: dict, new: str) -> None:
    """Kept system directories (symlinks copied as symlinks), the interpreter's prefix,
    device nodes and /proc, inside the new root `new`."""
    kept = [p for p in spec["keep"] if os.path.lexists(p)]
    for path in kept:
        if os.path.islink(path):
            os.symlink(os.readlink(path), new + path)
        elif os.path.isdir(path):
            _bind_read_only(path, new + path)
    prefix = spec["prefix"]
    if not any(_under(prefix, p) and not os.path.islink(p) for p in kept):
        _bind_read_only(prefix, new + prefix)
    os.makedirs(new + "/dev", mode=0o755)
    for node in DEVICE_NODES:
        if os.path.exists("/dev/" + node):
            open(f"{new}/dev/{node}", "ab").close()
            _mount("/dev/" + node, f"{new}/dev/{node}", None, MS_BIND, None)
    os.makedirs(new + "/proc", mode=0o555)
    _mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV, None)


def _pivot_into(spec: dict) -> None:
    """Build the minimal root on a tmpfs over the work dir's path, pivot into it and detach
    the host's tree; then mount the size-capped work dir at its usual path."""
    workdir = spec["workdir"]
    _mount("", "/", None, MS_REC | MS_PRIVATE, None)
    new = workdir  # the caller's (empty but for main.py) temp dir is the mount point
    _mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    _populate_root(spec, new)
    os.makedirs(new + workdir, mode=0o755)
    size = f"size={spec['tmpfs_bytes']},mode=700"
    _mount("tmpfs", new + workdir, "tmpfs", MS_NOSUID | MS_NODEV, size)
    os.makedirs(new + "/.old", mode=0o700)
    libc = _libc()
    _check(
        libc.syscall(_arch()[1]["pivot_root"], new.encode(), (new + "/.old").encode()), "pivot_root"
    )
    os.chdir("/")
    _check(libc.umount2(b"/.old", MNT_DETACH), "umount old root")
    os.rmdir("/.old")
    _mount("", "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)


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


def _lock_down() -> None:
    """no_new_privs (setuid binaries cannot raise privileges) then the seccomp filter."""
    _check(_libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    _install_seccomp()


def _exec_program(spec: dict) -> None:
    os.chdir(spec["workdir"])
    exe = spec["python"]
    os.execve(exe, [exe, "-I", "-S", "-u", "main.py"], spec["env"])


def _run_child(spec: dict) -> None:
    """In the forked child: drop to the sandbox uid, apply limits, lock down, exec."""
    try:
        if spec.get("watch_fd") is not None:
            os.close(spec["watch_fd"])
        uid = spec["uid"]
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        _set_limits(spec)
        _lock_down()
        _exec_program(spec)
    except BaseException as exc:  # noqa: BLE001 - report and die, whatever happened
        os.write(2, f"sandbox: could not start the program: {exc!r}\n".encode())
    os._exit(SETUP_FAILED)


def _status_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _supervise(child: int, watch_fd: int | None) -> int:
    """PID 1's loop: reap orphans until the program exits; stop at once if the caller died
    (EOF on the watch pipe). SIGCHLD wakes the select through Python's wakeup fd."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    fds = [wake_r] + ([watch_fd] if watch_fd is not None else [])
    while True:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return SETUP_FAILED
            if pid == 0:
                break
            if pid == child:
                return _status_code(status)
        ready, _, _ = select.select(fds, [], [], 1.0)
        if watch_fd in ready and not os.read(watch_fd, 1):
            return CALLER_GONE
        if wake_r in ready:
            os.read(wake_r, 4096)


def _namespace_main(spec: dict) -> int:
    workdir = spec["workdir"]
    with open(os.path.join(workdir, "main.py"), "rb") as f:
        code = f.read()
    os.umask(0o022)
    _pivot_into(spec)
    os.chown(workdir, spec["uid"], spec["uid"])
    with open(os.path.join(workdir, "main.py"), "wb") as f:
        f.write(code)
    sys.stdout.flush()
    child = os.fork()
    if child == 0:
        _run_child(spec)
    return _supervise(child, spec.get("watch_fd"))


def main() -> None:
    spec = json.loads(sys.argv[1])
    try:
        if spec["mode"] == "namespace":
            os._exit(_namespace_main(spec))
        _check(_libc().prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0), "pdeathsig")
        _set_limits(spec)
        _lock_down()
        _exec_program(spec)
    except BaseException as exc:  # noqa: BLE001 - the caller reads the reason as text
        os.write(2, f"sandbox: setup failed: {exc!r}\n".encode())
    os._exit(SETUP_FAILED)


if __name__ == "__main__":
    main()
