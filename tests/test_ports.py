"""The test servers' loopback ports (tests/helpers/ports.py): every test process claims a
block that no other living process holds (the two xdist workers, a pytest run a test starts,
the vLLM tiers CI runs beside them), a killed process's block is free again, and every block
lies below the kernel's ephemeral range."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ports

HOLDER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {helpers!r})
from ports import claim_block
print(claim_block(Path({locks!r})), flush=True)
time.sleep(60)
"""


def test_a_block_is_held_by_one_living_process_and_freed_when_it_dies(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    code = HOLDER.format(helpers=str(Path(ports.__file__).parent), locks=str(locks))
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    held = len(ports._held)
    try:
        theirs = int(holder.stdout.readline())
        mine = [ports.claim_block(locks) for _ in range(ports.BLOCKS - 1)]
        assert sorted([theirs, *mine]) == list(range(ports.BLOCKS))
        with pytest.raises(RuntimeError, match="held by other test processes"):
            ports.claim_block(locks)
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        assert ports.claim_block(locks) == theirs  # the kernel let the lock go
    finally:
        holder.kill()
        for handle in ports._held[held:]:
            handle.close()
        del ports._held[held:]


def test_blocks_are_disjoint_and_below_the_ephemeral_range() -> None:
    numbers = [port for i in range(ports.BLOCKS) for port in ports._block_range(i)]
    assert len(numbers) == len(set(numbers)) and max(numbers) < 32768
    assert len(ports._block_range(0)) >= 100  # room for the servers of a module
