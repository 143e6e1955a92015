"""The test servers' loopback ports (tests/helpers/ports.py): the two workers of the test
commands and a process outside any worker (a tier command run beside them) never share a
block, and every block lies below the kernel's ephemeral range."""

from __future__ import annotations

import os

import pytest
from helpers import ports


def blocks(monkeypatch: pytest.MonkeyPatch, worker: str | None) -> set[range]:
    """Every block a process named `worker` can take (its pid picks one of three)."""
    if worker is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    taken = set()
    for pid in range(3):
        monkeypatch.setattr(os, "getpid", lambda pid=pid: pid)
        taken.add(ports._block())
    return taken


def test_workers_and_a_process_outside_them_take_disjoint_blocks(monkeypatch) -> None:
    named = {name: blocks(monkeypatch, name) for name in ("gw0", "gw1", None)}
    every = [block for taken in named.values() for block in taken]
    assert all(len(taken) == 3 for taken in named.values())
    assert len(set(every)) == 9
    numbers = [port for block in every for port in block]
    assert len(numbers) == len(set(numbers)) and max(numbers) < 32768
