"""`rollout.weight_update=in_flight` on vLLM servers that label each token's weight version
(mixed into `frlab.rollout.remote.engine.RemoteEngine`; the endpoints: frlab.rollout.remote.
generate).

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


class InFlightMixin:
    """The label probe, label update and keep-pause of an in_flight update on vLLM servers."""

    _fleet: Fleet
    weight_update: str
    request_timeout_s: float
    _version: int
    _syncing: bool
    lora: dict | None

    async def _default_mode(self) -> str:
        """`rollout.weight_update=null`: in_flight when every server labels each token's version
        (frlab.serve run with --weight-update in_flight, vLLM with labels: probed here), drain
        otherwise (a server unreachable at start counts as one without labels)."""
        if self.lora is not None:
            return "drain"
        labels = await asyncio.gather(*(self._labels_at_start(s) for s in self._fleet.servers))
        mode = "in_flight" if all(labels) else "drain"
        log.info("remote engine: rollout.weight_update=null -> %s (%s)", mode,
                 "every server labels each token's version" if all(labels) else
                 "not every server labels each token's version")  # fmt: skip
        return mode

    async def _labels_at_start(self, server: Server) -> bool:
        try:
            served = control.served_weight_update(await self._server_info(server))
            if served is not None:  # frlab.serve labels in its own mode
                return served == "in_flight"
            server.labels = await self._offers_labels(server)
        except (ServerFault, EngineError, proto.MalformedResponse):
            return False
        return bool(server.labels)

    def _generates(self, server: Server) -> bool:
        """Whether this server's requests go to the generate endpoint (labels, in_flight)."""
        return bool(server.labels) and self.weight_update == "in_flight"

    async def _probe_labels(self, server: Server) -> bool:
        """Probe a vLLM-like server once (`labels`; drain and resubmit need no labels: no
        probe); False (refused) when in_flight needs labels it does not offer."""
        if self.weight_update != "in_flight":
            return True
        if server.labels is None:
            server.labels = await self._offers_labels(server)
        if server.labels:
            return True
        self._fleet.refuse(server, NO_LABELS.format(routes=" / ".join(gen.LABEL_ROUTES)))
        return False

    async def _offers_labels(self, server: Server) -> bool:
        """The routes in `/openapi.json`, then a one-token generate answer with spans."""
        try:
            if not gen.offers_labels(await self._fleet.get(server, gen.OPENAPI)):
                return False
            if server.paused and not self._syncing:  # left frozen by a failed update
                await self._resume(server)
            probe = gen.probe_request(server.model or "")
            return gen.answers_labels(await self._fleet.post(server, gen.GENERATE, probe))
        except EngineError:  # 4xx: no OpenAPI document, or the route is disabled
            return False

    async def _set_label(self, server: Server) -> bool:
        """Set a generating server's label to the fleet's version (False: refused)."""
        if not self._generates(server):
            return True
        try:
            answer = await self._fleet.post(server, gen.UPDATE_WEIGHT_VERSION,
                                      gen.label_request(self._version))  # fmt: skip
        except EngineError as exc:
            self._fleet.refuse(server, f"its weight version label was not set: {exc}")
            return False
        if not gen.label_set(answer, self._version):
            self._fleet.refuse(server, f"/update_weight_version answered {answer!r:.200}")
            return False
        return True

    async def _freeze(self) -> None:
        """`POST /pause?mode=keep&clear_cache=false` on every live generating server (gate
        closed): its requests stop between two decode steps; one that refuses has its
        requests aborted."""
        live = [s for s in self._fleet.servers if self._generates(s) and s.state != "dead"]
        await asyncio.gather(*(self._freeze_one(s) for s in live))

    async def _freeze_one(self, server: Server) -> None:
        try:
            await self._fleet.post(server, gen.PAUSE_KEEP, {}, timeout=self.request_timeout_s)
        except (ServerFault, EngineError) as exc:
            log.warning("remote engine: %s refused the in_flight pause, aborting its requests: "
                        "%s", server.url, exc)  # fmt: skip
            await self._abort_all(server)
            return
        server.paused = True

    async def _abort_unverified(self) -> None:
        """Abort every request held by a frozen server the update left unverified."""
        bad = [
            s for s in self._fleet.servers if s.paused and self._generates(s) and s.state != "ok"
        ]
        await asyncio.gather(*(self._abort_all(s) for s in bad if s.state != "dead"))
