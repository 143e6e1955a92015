"""The math-verify worker pool: hard deadlines, process-group kills, startup failures."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from envs.math.symbolic import SymbolicVerifier

# A worker that says it is ready, starts a grandchild, then never answers a request.
HANGING_WORKER = """
import json, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(json.dumps({"ready": True, "error": None, "child": child.pid}), flush=True)
sys.stdin.readline()
time.sleep(600)
"""
BROKEN_WORKER = 'import json; print(json.dumps({"ready": False, "error": "no math_verify"}))'
# Answers "equal" iff gold == pred, and records how many requests are in flight at once.
ECHO_WORKER = """
import json, os, sys, time
log = sys.argv[1]
print(json.dumps({"ready": True, "error": None}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    with open(log, "a") as f:
        f.write("start\\n")
    time.sleep(0.05)
    with open(log, "a") as f:
        f.write("end\\n")
    print(json.dumps({"equal": req["gold"] == req["pred"], "error": None}), flush=True)
"""


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for a reaper counts as dead)."""
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except (OSError, IndexError):
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_worker_missing_its_deadline_is_killed_with_its_children() -> None:
    verifier = SymbolicVerifier(1, argv=[sys.executable, "-c", HANGING_WORKER])
    try:
        worker = verifier._acquire()
        assert worker is not None and worker.ready is not None
        child, pid = worker.ready["child"], worker.process.pid
        verifier._release(worker)
        assert _alive(child) and _alive(pid)
        assert verifier.equal("1", "1", timeout_s=0.3) is False
        assert verifier.timeouts == 1
        assert worker.process.poll() is not None
        for _ in range(200):  # the orphaned grandchild is killed with the group
            if not _alive(child):
                break
            threading.Event().wait(0.01)
        assert not _alive(child)
        assert verifier._live == 0 and not verifier._idle
    finally:
        verifier.close()


def test_a_worker_that_cannot_start_disables_symbolic_checks() -> None:
    verifier = SymbolicVerifier(1, argv=[sys.executable, "-c", BROKEN_WORKER])
    try:
        assert verifier.equal("1/2", "0.5") is None
        assert verifier.startup_error == "no math_verify"
        assert verifier.equal("1/2", "0.5") is None
        assert verifier._live == 0
    finally:
        verifier.close()


def test_pool_never_runs_more_workers_than_its_size(tmp_path: Path) -> None:
    log = tmp_path / "log"
    verifier = SymbolicVerifier(2, argv=[sys.executable, "-c", ECHO_WORKER, str(log)])
    results: list[bool | None] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        verdict = verifier.equal(str(i), str(i if i % 2 else -i), timeout_s=30)
        with lock:
            results.append(verdict is True and i % 2 == 1 or verdict is False and i % 2 == 0)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    verifier.close()
    assert results == [True] * 8
    depth, deepest = 0, 0
    for event in log.read_text().split():
        depth += 1 if event == "start" else -1
        deepest = max(deepest, depth)
    assert deepest == 2 and len(log.read_text().split()) == 16
    assert verifier._live == 0


def test_closed_verifier_refuses_work_and_bad_arguments_are_errors() -> None:
    with pytest.raises(ValueError, match="max_workers"):
        SymbolicVerifier(0)
    verifier = SymbolicVerifier(1, argv=[sys.executable, "-c", BROKEN_WORKER])
    with pytest.raises(ValueError, match="timeout_s"):
        verifier.equal("1", "1", timeout_s=0)
    verifier.close()
    with pytest.raises(RuntimeError, match="closed"):
        verifier.equal("1", "1")


def test_real_worker_answers_and_stays_reusable() -> None:
    pytest.importorskip("math_verify")
    verifier = SymbolicVerifier(1)
    try:
        assert verifier.equal("\\frac{1}{2}", "0.5") is True
        assert verifier.equal("\\frac{1}{2}", "0.6") is False
        assert verifier.equal("\\frac{1}{2}", "\\frac{") is False  # unparsable, not an error
        assert verifier.timeouts == 0 and verifier._live == 1
    finally:
        verifier.close()


def test_every_waiting_thread_learns_that_workers_cannot_start() -> None:
    verifier = SymbolicVerifier(1, argv=[sys.executable, "-c", BROKEN_WORKER])
    results: list[bool | None] = []
    threads = [
        threading.Thread(target=lambda: results.append(verifier.equal("1", "1"))) for _ in range(6)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60  # a lost wake-up would leave a thread blocked forever
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    verifier.close()
    assert not any(t.is_alive() for t in threads)
    assert results == [None] * 6
