"""Loopback ports for test servers that no other test process is handed.

`socket.bind(0)` hands out a port from the kernel's ephemeral range and forgets it once the
probe socket closes: another test process's probe, or any client's outgoing connection, can
get the same port before the test's server binds it, and a health check then reaches the
wrong server. A free check alone cannot see a port that another process has picked for a
server still loading (a vLLM server binds only once its model is up).

So ports come from below the ephemeral range (which starts at 32768 on Linux by default), cut
into BLOCKS blocks, and each test process that asks for a port first claims a block of its own:
an exclusive `flock` on the block's lock file, held until the process ends (the kernel lets it
go even after a SIGKILL). The two xdist workers, a pytest run a test starts, and the vLLM tiers
that CI runs beside the test commands thus never pick from one block; within its block a
process walks the ports in order, each checked free before use.
"""

from __future__ import annotations

import fcntl
import functools
import itertools
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

LOW, HIGH = 20_000, 32_000  # below the kernel's ephemeral ports (32768-60999 by default)
BLOCKS = 24  # blocks of (HIGH - LOW) // BLOCKS ports, one per test process at a time
LOCKS = Path(tempfile.gettempdir()) / "frlab-test-ports"
_held: list[IO[bytes]] = []  # the claimed block's lock file, open for the process's life


def _block_range(index: int) -> range:
    size = (HIGH - LOW) // BLOCKS
    return range(LOW + index * size, LOW + (index + 1) * size)


def claim_block(locks: Path = LOCKS) -> int:
    """The index of a block no other living process holds, now held by this one; tried from
    a pid-chosen start so that processes starting together rarely contend for one lock."""
    locks.mkdir(parents=True, exist_ok=True)
    start = os.getpid() % BLOCKS
    for index in ((start + i) % BLOCKS for i in range(BLOCKS)):
        handle = (locks / f"block-{index}.lock").open("ab")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        _held.append(handle)
        return index
    raise RuntimeError(f"all {BLOCKS} loopback port blocks are held by other test processes")


@functools.cache
def _ports() -> Iterator[int]:
    return itertools.cycle(_block_range(claim_block()))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, from this process's own block."""
    ports = _ports()
    size = len(_block_range(0))
    for _ in range(size):
        port = next(ports)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free loopback port in this process's block of {size}")
