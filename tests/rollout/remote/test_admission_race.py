"""Admission of a server while one of its requests fails: the fault wins. A sync admits every
live server while requests may still be on it (under in_flight they are frozen there); a
request that fails meanwhile marks the server dead, which forgets whether it labels tokens.
Admitting it anyway would route its requests to the completions path, whose answers carry no
labels, so every one of them would fail as stale until the prober re-probed it."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from helpers.labelling_vllm import generate_response

from frlab.rollout.remote import control
from frlab.rollout.remote import generate as gen
from frlab.rollout.remote import protocol as proto
from frlab.rollout.remote.fleet import Fleet, ServerFault
from frlab.rollout.remote.traffic import Traffic
from frlab.rollout.remote.weight_sync import VERSION_METHOD, WeightSync

VERSION = 3


class LabellingServer:
    """Answers what an admission asks a labelling vLLM server (dev mode, --enable-scale-out);
    `on_version_check` runs while the version check is on the wire."""

    def __init__(self) -> None:
        self.on_version_check: Any = None
        self.paths: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.paths.append(path)
        if path == proto.SERVER_INFO.split("?")[0]:
            return httpx.Response(200, json=control.server_info(proto.PROCESSED_LOGPROBS))
        if path == gen.OPENAPI:
            return httpx.Response(200, json={"paths": {r: {} for r in gen.LABEL_ROUTES}})
        if path == gen.GENERATE:
            return httpx.Response(
                200, json=generate_response([0], [5], [-0.5], [0], "length", "probe")
            )
        if path == gen.UPDATE_WEIGHT_VERSION:
            return httpx.Response(200, json={"success": True, "new_version": str(VERSION)})
        if path == proto.COLLECTIVE_RPC:
            assert VERSION_METHOD in request.content.decode()
            if self.on_version_check is not None:
                self.on_version_check()
            return httpx.Response(200, json=control.rpc_answer([{"version": VERSION}]))
        return httpx.Response(404, json={"detail": path})


def sync_on(server: LabellingServer) -> tuple[Fleet, WeightSync]:
    fleet = Fleet(["http://server"], 5.0, 0.05, 5.0)
    fleet.client = httpx.AsyncClient(transport=httpx.MockTransport(server))
    sync = WeightSync(
        fleet,
        Traffic(5.0),
        mode="in_flight",
        version=VERSION,
        model="m",
        snapshot_dir=None,
        keep_snapshots=1,
        nccl=None,
        adapters=None,
    )
    return fleet, sync


def admit(sync: WeightSync) -> None:
    async def go() -> None:
        sync.lock = asyncio.Lock()
        async with sync.lock:
            await sync.admit(sync.fleet.servers[0])

    asyncio.run(go())


def test_a_server_marked_dead_while_it_is_admitted_stays_dead_until_re_probed() -> None:
    answers = LabellingServer()
    fleet, sync = sync_on(answers)
    server = fleet.servers[0]
    admit(sync)  # a clean admission: labels probed, label set, version proved
    assert (server.state, server.labels, server.version) == ("ok", True, VERSION)

    server.state = "unverified"  # as a sync leaves it while it loads and re-verifies
    fault = ServerFault("dead", "/inference/v1/generate transport error: ReadError('')")
    answers.on_version_check = lambda: fleet.fault(server, fault)
    admit(sync)
    assert server.state == "dead" and server.labels is None, (server.state, server.labels)
    assert fleet.stats()["readmissions"] == 0 and fleet.stats()["server_faults"] == 1

    answers.on_version_check, probes = None, answers.paths.count(gen.GENERATE)
    admit(sync)  # the prober's next check re-probes its labels, then admits it
    assert (server.state, server.labels) == ("ok", True)
    assert answers.paths.count(gen.GENERATE) == probes + 1
    assert fleet.stats()["readmissions"] == 1


def test_a_stale_refusal_during_an_admission_also_wins() -> None:
    answers = LabellingServer()
    fleet, sync = sync_on(answers)
    server = fleet.servers[0]
    answers.on_version_check = lambda: fleet.refuse(server, "answered token versions [9]")
    admit(sync)
    assert server.state == "stale" and server.why == "answered token versions [9]"
