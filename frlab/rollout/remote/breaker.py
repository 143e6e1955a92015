"""The fleet's circuit breaker: when each server is probed, and when it counts as gone.

A fleet on a shared cluster loses servers and gets them back (an out-of-memory restart, a
preempted node, a network blip). The remote engine sends a request only to a healthy server
(`ok`), so while none is healthy it sends nothing and the rollout pool admits nothing
(`Fleet.outage`, frlab.rollout.engine.Outage). Each server has one watcher task (`watch`):

- while it serves, or a weight sync verifies it, a liveness probe every LIVENESS_S:
  `GET /health` must answer 200 within `min(LIVENESS_TIMEOUT_S, request_timeout_s)`; after
  LIVENESS_MISSES misses in a row (a stopped or hung process) it is marked dead, its requests in
  flight fail over at once and a sync gives up on it (`Fleet.while_up`), instead of each
  waiting out `request_timeout_s`;
- while it does not, a probe on `GET /health` and, once that answers, its admission (the
  learner's current weights loaded and their version proved before any request:
  frlab.rollout.remote.weight_sync), on a backoff (`Backoff`): `probe_interval_s` after it went
  down, doubling with every failure in a row up to `probe_backoff_max_s`, each wait drawn
  within +-20% (jitter: servers that went down together are not probed in lockstep). An answer
  to a request resets the backoff (`Fleet.served`); a re-admission alone does not, so a server
  that passes its probes but fails every request is tried less and less often.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from frlab.rollout.remote.auth import FleetAuthError

LIVENESS_S = 2.0  # how often a serving server's /health is asked
LIVENESS_MISSES = 2  # liveness probes in a row without a 200 that mark it dead
LIVENESS_TIMEOUT_S = 5.0  # a liveness probe waits at most this (and request_timeout_s)
JITTER = 0.2  # each backoff wait is drawn within +-20% of its nominal value
TICK_S = 0.5  # the longest a watcher sleeps before it looks at its server's state again


class Backoff:
    """The wait before the n-th probe in a row of a server that is down: `first_s * 2**(n-1)`,
    at most `max_s`, times a random factor in [1 - JITTER, 1 + JITTER]."""

    def __init__(self, first_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self.first_s, self.max_s = float(first_s), max(float(first_s), float(max_s))
        self.rng = rng or random.Random()

    def nominal(self, failures: int) -> float:
        """The wait without jitter after `failures` failures in a row (>= 1)."""
        return min(self.max_s, self.first_s * 2.0 ** min(max(failures - 1, 0), 62))

    def delay(self, failures: int) -> float:
        return self.nominal(failures) * self.rng.uniform(1.0 - JITTER, 1.0 + JITTER)


# probe(server): True when admitted, False when it failed (the backoff grows), None when not
# tried (an update holds the fleet, or the engine is paused): tried again after first_s
Probe = Callable[[Any], Awaitable["bool | None"]]


async def watch(
    fleet: Any, server: Any, probe: Probe, syncing: Callable[[], bool] = lambda: False
) -> None:
    """One server's watcher (a `Fleet` and one of its `Server`s: frlab.rollout.remote.fleet),
    for the engine's lifetime (see the module docstring); a server that refuses the fleet's
    secret ends it (the run stops: `Fleet.down_reason`). `syncing()`: a weight sync is under
    way; the servers it verifies (`unverified`, `stale`) are checked for liveness like serving
    ones, so a sync gives up on one that stops answering instead of waiting out
    `request_timeout_s`."""

    def serving() -> bool:
        return server.state == "ok" or (server.state in ("unverified", "stale") and syncing())

    while True:
        if serving():
            await asyncio.sleep(LIVENESS_S)
            if serving():
                await check_alive(fleet, server, serving)
            continue
        wait = server.next_probe - time.monotonic()
        if wait > 0:
            await asyncio.sleep(min(wait, TICK_S))
            continue
        try:
            tried = await probe(server)
        except FleetAuthError:  # the fleet reports it (down_reason): the run stops
            return
        if tried is False and server.state != "ok":
            fleet.probe_failed(server)
        elif tried is None:
            server.next_probe = time.monotonic() + fleet.backoff.first_s


async def check_alive(fleet: Any, server: Any, serving: Callable[[], bool]) -> None:
    """One liveness probe of a serving server; the LIVENESS_MISSES-th miss in a row marks it
    dead (its requests in flight fail over, a sync verifying it gives up on it) while it is
    still `serving()`."""
    timeout = min(LIVENESS_TIMEOUT_S, fleet.request_timeout_s)
    if await fleet.healthy(server, timeout):
        server.misses = 0
        return
    server.misses += 1
    if server.misses >= LIVENESS_MISSES and serving():
        why = f"GET /health gave no 200 within {timeout:g} s, {server.misses} times in a row"
        fleet.unresponsive(server, why)
