"""`rollout.weight_update=in_flight` on vLLM servers that label each token's weight version
(used by the `remote` engine's weight sync; the endpoints: frlab.rollout.remote.generate).

Each vLLM-like server is probed when it is first admitted (again after it was marked dead):
it `labels` when its `/openapi.json` lists `/inference/v1/generate`, `/update_weight_version`
and `/pause` (vLLM 0.32+ run with `--enable-scale-out` and dev mode) and a one-token generate
request answers with version spans. Under in_flight such a server is admitted only
after its label is set to the fleet's version, and its requests go to the generate endpoint,
whose answer carries vLLM's own per-token version spans. A weight update closes the client's
gate, freezes every labelled server between two decode steps (`POST
/pause?mode=keep&clear_cache=false`: KV kept, new requests queued), loads (filesystem or
nccl, as under drain), sets the label to the new version (between steps: tokens sampled
before it carry the old label, all after it the new), verifies, then `POST /resume`.
A labelled server that could not be paused, or that is
not verified after the load, has every request it holds aborted before it resumes: they fail
over (retried elsewhere from their start), so no token sampled on weights frlab could not
verify is kept. Its prefix cache is not reset during the update (frozen requests hold KV
blocks, so vLLM's reset would fail); as with vLLM in-process, a later prefix-cache hit reuses
KV computed by the old weights, and its tokens carry the new version. Under in_flight a vLLM
server without labels is refused at admission with an error naming rollout.weight_update.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from frlab.rollout.engine import EngineError
from frlab.rollout.remote import control
from frlab.rollout.remote import generate as gen
from frlab.rollout.remote import protocol as proto
from frlab.rollout.remote.fleet import Fleet, Server, ServerFault

log = logging.getLogger("frlab.rollout.remote.engine")

NO_LABELS = (
    "rollout.weight_update=in_flight needs servers that label each token's weight version: "
    "this vLLM server offers none (its /openapi.json must list {routes} and its generate "
    "answers must carry weight_versions spans: vLLM 0.32+ run with --enable-scale-out and "
    "VLLM_SERVER_DEV_MODE=1); use rollout.weight_update=drain or resubmit"
)


async def default_mode(fleet: Fleet, model: str | None, lora: bool) -> str:
    """`rollout.weight_update=null`: in_flight when every server labels each token's version
    (frlab.serve run with --weight-update in_flight, vLLM with labels: probed here), drain
    otherwise (a server unreachable at start counts as one without labels; a LoRA fleet:
    drain)."""
    if lora:
        return "drain"
    labels = await asyncio.gather(*(_labels_at_start(fleet, s, model) for s in fleet.servers))
    mode = "in_flight" if all(labels) else "drain"
    log.info(
        "remote engine: rollout.weight_update=null -> %s (%s)",
        mode,
        "every server labels each token's version"
        if all(labels)
        else "not every server labels each token's version",
    )
    return mode


async def _labels_at_start(fleet: Fleet, server: Server, model: str | None) -> bool:
    try:
        served = control.served_weight_update(await fleet.server_info(server, model))
        if served is not None:  # frlab.serve labels in its own mode
            return served == "in_flight"
        server.labels = await _offers_labels(fleet, server, lambda: False)
    except (ServerFault, EngineError, proto.MalformedResponse):
        return False
    return bool(server.labels)


def generates(server: Server, mode: str | None) -> bool:
    """Whether this server's requests go to the generate endpoint (labels, in_flight)."""
    return bool(server.labels) and mode == "in_flight"


async def probe_labels(
    fleet: Fleet, server: Server, mode: str | None, syncing: Callable[[], bool]
) -> bool:
    """Probe a vLLM-like server once (`labels`; drain and resubmit need no labels: no
    probe); False (refused) when in_flight needs labels it does not offer. `syncing()`: an
    update holds the fleet (a server it paused stays paused)."""
    if mode != "in_flight":
        return True
    if server.labels is None:
        server.labels = await _offers_labels(fleet, server, syncing)
    if server.labels:
        return True
    fleet.refuse(server, NO_LABELS.format(routes=" / ".join(gen.LABEL_ROUTES)))
    return False


async def _offers_labels(fleet: Fleet, server: Server, syncing: Callable[[], bool]) -> bool:
    """The routes in `/openapi.json`, then a one-token generate answer with spans."""
    try:
        if not gen.offers_labels(await fleet.get(server, gen.OPENAPI)):
            return False
        if server.paused and not syncing():  # left frozen by a failed update
            await fleet.resume(server)
        probe = gen.probe_request(server.model or "")
        return gen.answers_labels(await fleet.post(server, gen.GENERATE, probe))
    except EngineError:  # 4xx: no OpenAPI document, or the route is disabled
        return False


async def set_label(fleet: Fleet, server: Server, version: int, mode: str | None) -> bool:
    """Set a generating server's label to the fleet's `version` (False: refused)."""
    if not generates(server, mode):
        return True
    try:
        answer = await fleet.post(server, gen.UPDATE_WEIGHT_VERSION, gen.label_request(version))
    except EngineError as exc:
        fleet.refuse(server, f"its weight version label was not set: {exc}")
        return False
    if not gen.label_set(answer, version):
        fleet.refuse(server, f"/update_weight_version answered {answer!r:.200}")
        return False
    return True


async def freeze(fleet: Fleet, mode: str | None) -> None:
    """`POST /pause?mode=keep&clear_cache=false` on every live generating server (gate
    closed): its requests stop between two decode steps; one that refuses has its requests
    aborted."""
    live = [s for s in fleet.servers if generates(s, mode) and s.state != "dead"]
    await asyncio.gather(*(fleet.freeze(s, gen.PAUSE_KEEP) for s in live))


async def abort_unverified(fleet: Fleet, mode: str | None) -> None:
    """Abort every request held by a frozen server the update left unverified."""
    bad = [s for s in fleet.servers if s.paused and generates(s, mode) and s.state != "ok"]
    await asyncio.gather(*(fleet.abort_all(s) for s in bad if s.state != "dead"))
