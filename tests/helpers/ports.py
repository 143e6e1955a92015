"""Loopback ports for test servers that no other xdist worker is handed.

`socket.bind(0)` hands out a port from the kernel's ephemeral range and forgets it once the
probe socket closes: another xdist worker's probe, or any client's outgoing connection, can
get the same port before the test's server binds it, and a health check then reaches the
wrong server. Ports here come from below the ephemeral range (which starts at 32768 on
Linux by default), from a block per xdist worker, walked in order and each checked free before
use, so the workers never pick one port. A pytest run that a test starts from a worker takes
one of the worker's three blocks by its pid: it may share its parent's block, where the
free check is the only guard. A process outside any worker (a tier command such as
`-m vllm_cpu`, which CI runs beside the slow tests, or `-n 0`) takes the last three blocks,
which no worker of the two-worker commands uses: the free check cannot see a port that a
slow-starting server of another run has picked and not yet bound.
"""

from __future__ import annotations

import itertools
import os
import socket

LOW, HIGH = 20_000, 32_000  # below the kernel's ephemeral ports (32768-60999 by default)
BLOCKS = 12  # per-process blocks of (HIGH - LOW) // BLOCKS ports
OUTSIDE = BLOCKS // 3 - 1  # the blocks of a process outside any xdist worker: the last three


def _block() -> range:
    """This process's ports: one of three blocks per xdist worker ("gw1": 1), by the pid (a
    pytest run that a test starts from a worker inherits the worker's name); outside any
    worker, one of the last three."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else OUTSIDE
    size = (HIGH - LOW) // BLOCKS
    first = LOW + ((index * 3 + os.getpid() % 3) % BLOCKS) * size
    return range(first, first + size)


BLOCK = _block()
_NEXT = itertools.cycle(BLOCK)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now and that no other xdist worker will pick."""
    for _ in BLOCK:
        port = next(_NEXT)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free loopback port in this process's block {BLOCK}")
