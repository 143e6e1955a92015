"""How a fleet's weight update meets the requests in flight (the `remote` engine's requests
and weight sync use these).

`weight_update=drain` waits for them (frlab.rollout.remote.weight_sync); `in_flight` lets them
run on, each token labelled by the server (`frlab_versions` of frlab.serve, or vLLM's own
spans: frlab.rollout.remote.in_flight); `resubmit`
stops them and sends the rest again from a fresh prefill on the new weights, so no token is
sampled on KV that old weights computed. It takes one of two forms, by server:

- frlab.serve reports its own mode in `/server_info` (`frlab_weight_update`) and labels every
  token: run it with `--weight-update resubmit`, and its torch engine re-prefills its running
  requests on the new weights at the load itself (the fleet neither drains nor stops them). A
  server that reports another mode than `in_flight` / `resubmit` asks for is refused as stale.
- vLLM (no such field, no labels): the update closes the client's gate, asks each live server
  with requests in flight `POST /pause?mode=abort` (vLLM's dev-mode RL router: it ends every
  request it holds, which answer with their tokens so far and `finish_reason: "abort"`, and
  queues new ones), waits until none of this client's requests is in flight there (repeating
  `POST /abort_requests` for one that reached the server after the pause and was queued),
  loads and verifies the new weights as under drain, then `POST /resume`. Each aborted request
  is sent again as prompt + its tokens with the rest of its `max_new_tokens`: its first tokens
  carry the old version (the server's, proved before the load), the rest the new; one aborted
  with its budget spent ends as `length`, one whose last token is a stop token as `stop`
  (frlab.rollout.weight_modes.continue_after_abort, which the in-process vLLM engine runs
  too). An abort this client did not ask for is a server fault (the fragment fails over).

A server that dies during the update is marked dead and skipped, as under drain; its requests
fail over to another server (from the tokens they had before that fragment).
"""

from __future__ import annotations

import asyncio
import logging

from frlab.rollout.remote import protocol as proto
from frlab.rollout.remote.fleet import Fleet, Server, ServerFault

log = logging.getLogger("frlab.rollout.remote.engine")

ABORT_POLL_S = 0.2  # how often a resubmit update re-aborts requests queued after its pause


def check_abort(done: proto.Completion, aborts_at_send: int, aborts_now: int) -> None:
    """An aborted answer is one of ours only if a resubmit update stopped it since it was sent
    (`aborts`: the count of resubmit updates that stopped requests)."""
    if done.finish_reason == "abort" and aborts_now == aborts_at_send:
        raise ServerFault("dead", "it aborted the request, and no weight update asked it to")


def token_versions(
    server: Server, sent_at: int | None, done: proto.Completion, version: int, mode: str | None
) -> list[int]:
    """Per-token versions from the server's own answers (see the module docstring);
    `sent_at`: the version the server had proved when the request was sent, `version` the
    fleet's now. A label above the last version the server proved is refused unless an
    update is verifying it now (`unverified`): one refused or marked since proved nothing."""
    if done.versions is not None:
        proved = version if server.state in ("ok", "unverified") else server.version
        if (
            sent_at is None
            or proved is None
            or any(not sent_at <= v <= min(proved, version) for v in done.versions)
        ):
            raise ServerFault(
                "stale",
                f"answered token versions {sorted(set(done.versions))}, it proved "
                f"v{sent_at} (last v{server.version}, now {server.state}) and the fleet is at "
                f"v{version}",
            )
        return list(done.versions)
    if mode == "in_flight":
        raise ServerFault(
            "stale",
            "rollout.weight_update=in_flight needs servers that label "
            "each token's version (frlab_versions, or vLLM's weight_versions), "
            "and it answered none",
        )
    if sent_at is None or server.version != sent_at:
        raise ServerFault(
            "stale", f"weights changed from v{sent_at} to v{server.version} during the request"
        )
    return [sent_at] * len(done.token_ids)


async def stop_requests(fleet: Fleet) -> None:
    """Pause-with-abort each live vLLM-like server with requests in flight and wait (within
    request_timeout_s + 5 s) until none of them is in flight; call with the gate closed and
    the update's abort counted (the hold of the update)."""
    busy = [s for s in fleet.servers if s.stops and s.state != "dead" and s.in_flight]
    await asyncio.gather(*(fleet.pause_abort(s) for s in busy))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + fleet.request_timeout_s + 5.0
    while any(s.in_flight and s.state != "dead" for s in busy):
        if loop.time() > deadline:
            log.warning(
                "remote engine: %d requests still in flight after a resubmit abort",
                sum(s.in_flight for s in busy),
            )
            return
        await asyncio.sleep(ABORT_POLL_S)
        late = [s for s in busy if s.paused and s.in_flight and s.state != "dead"]
        await asyncio.gather(*(fleet.abort_all(s) for s in late))
