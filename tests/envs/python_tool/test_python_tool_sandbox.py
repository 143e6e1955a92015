"""The Python-tool sandbox runs code and holds its limits: exit status and errors as text (it
never raises), time, output, memory and disk caps, a fresh work dir, separate concurrent calls.

Tests that rely on namespaces skip in plain mode (`needs_namespace`, helpers.sandbox).
"""

from __future__ import annotations

import errno
import signal
import tempfile
from pathlib import Path

import pytest
from helpers.sandbox import needs_namespace

from envs.python_tool import run_python


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


def test_workdir_is_fresh_and_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    code = (
        "import os\nopen('out.txt', 'w').write('x' * "
        "100)\nprint(os.getcwd())\nprint(os.listdir('.'))"
    )
    r = run_python(code)
    assert r.exit_code == 0, r.stderr
    cwd, listing = r.stdout.splitlines()
    assert cwd.startswith(str(root)) and "out.txt" in listing
    assert list(root.iterdir()) == []


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


def test_fatal_signal_is_reported_as_negative_exit_code() -> None:
    r = run_python(
        "import os, signal\nprint('bye', flush=True)\nos.kill(os.getpid(), signal.SIGSEGV)"
    )
    assert (r.stdout, r.exit_code, r.timed_out) == ("bye\n", -signal.SIGSEGV, False)
