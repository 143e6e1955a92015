"""The `remote` engine's own requests: the gate that lets them out and the count in flight.

A request waits at the gate while the user paused the engine or a weight update holds it;
`drain` waits (with a deadline) until none of this client's requests is in flight. `aborts`
counts the resubmit updates that stopped requests: an aborted answer sent before the latest
one is this client's doing, any other abort is a server fault
(frlab.rollout.remote.resubmit). Used on the engine's event loop only.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("frlab.rollout.remote.engine")


class Traffic:
    """The gate, the in-flight count and the flags that close the gate."""

    def __init__(self, request_timeout_s: float) -> None:
        self.drain_timeout_s = float(request_timeout_s) + 5.0  # each request ends by then
        self.gate: asyncio.Event | None = None  # set while requests may be dispatched
        self.idle: asyncio.Event | None = None  # set while no request is in flight
        self.in_flight = 0
        self.aborts = 0  # resubmit updates that stopped requests so far
        self.user_paused = self.syncing = self.held = self.stopping = False

    def open(self) -> None:
        """Create the events (call on the engine's event loop); the gate opens."""
        self.gate, self.idle = asyncio.Event(), asyncio.Event()
        self.gate.set()
        self.idle.set()

    def refresh(self) -> None:
        """Open the gate unless the user paused the engine or an update holds it."""
        if self.user_paused or self.syncing:
            self.gate.clear()
        else:
            self.gate.set()

    async def wait_gate(self) -> None:
        while not self.gate.is_set():
            await self.gate.wait()

    def sent(self) -> None:
        self.in_flight += 1
        self.idle.clear()

    def answered(self) -> None:
        self.in_flight -= 1
        if not self.in_flight:
            self.idle.set()

    async def drain(self) -> None:
        """Wait for the requests in flight (each ends within request_timeout_s: done or
        failed), at most `drain_timeout_s`."""
        try:
            await asyncio.wait_for(self.idle.wait(), self.drain_timeout_s)
        except TimeoutError:
            log.warning(
                "remote engine: %d requests still in flight at a weight sync", self.in_flight
            )
