"""`rollout.weight_update=in_flight` on a fleet of vLLM-like servers that label each token's
version (`LabellingVllmServer`): an update freezes the requests between decode steps
(`/pause?mode=keep`), loads, sets the label, resumes; each token's version is the server's
label, checked against the versions the fleet knows."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.fleet import remote_engine
from helpers.labelling_vllm import LabellingVllmServer, generate_response, version_spans
from helpers.pausing_vllm import PausingVllmServer
from test_remote_resubmit import WEIGHTS, Background, counting_from, update, wait_until

from frlab.defaults import sampling_params
from frlab.rollout.engine import EngineError
from frlab.rollout.remote import generate as gen
from frlab.rollout.remote import protocol as proto


@pytest.fixture
def server() -> Iterator[LabellingVllmServer]:
    fake = LabellingVllmServer(step_s=0.02)
    yield fake
    fake.close()


def engine_on(servers: list[Any], tmp_path: Path, mode: str = "in_flight", **kw: Any):
    engine = remote_engine(
        [s.url for s in servers],
        snapshot_dir=str(tmp_path),
        request_timeout_s=10.0,
        max_retries=2,
        probe_interval_s=0.05,
        startup_timeout_s=kw.pop("startup_timeout_s", 5.0),
        initial_weights=WEIGHTS,
        weight_update=mode,
        **kw,
    )
    engine.start()
    return engine


def test_a_request_spanning_an_update_keeps_running_with_vllms_labels(
    server: LabellingVllmServer, tmp_path: Path
) -> None:
    """Sent once, never aborted: its first tokens carry the old version, the rest the new,
    each exactly the version the workers held when it was sampled (the server holds the
    request at its fifth token until the update's pause arrives)."""
    engine = engine_on([server], tmp_path)
    server.hold_at = 5
    try:
        assert server.label == "0" and engine.servers[0].labels is True and server.probes == 1
        job = Background(engine, 1, max_new_tokens=30)
        wait_until(lambda: server.in_progress() >= 5)
        update(engine, 1)
        (res,) = job.join()
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert res.versions == [0] * 5 + [1] * 25
    assert res.token_ids == counting_from(0, 30) and res.finish_reason == "length"
    assert [v for held in server.generated for v in held.versions] == res.versions
    assert server.received == [([1, 2, 3, 0], 30)] and not server.generated[0].aborted
    assert server.pauses == [
        gen.UPDATE_WEIGHT_VERSION,
        gen.PAUSE_KEEP,
        gen.UPDATE_WEIGHT_VERSION,
        proto.RESUME,
    ]
    assert stats["retries"] == 0 and stats["server_faults"] == 0


def test_six_requests_across_two_updates_are_whole_and_labelled_exactly(
    server: LabellingVllmServer, tmp_path: Path
) -> None:
    engine = engine_on([server], tmp_path)
    try:
        job = Background(engine, 6, max_new_tokens=40)
        wait_until(lambda: server.in_progress() >= 12)
        update(engine, 1)
        wait_until(lambda: server.in_progress() >= 30)
        update(engine, 2)
        results = job.join()
        assert engine.stats()["retries"] == 0
    finally:
        engine.shutdown()
    truth = {h.prompt[-1]: h.versions for h in server.generated}
    for i, res in enumerate(results):
        assert res.token_ids == counting_from(i, 40) and res.versions == truth[i]
        assert res.versions == sorted(res.versions) and res.versions[-1] == 2
    assert len(server.received) == 6 and any(len(set(r.versions)) == 3 for r in results)


def test_labels_outside_the_versions_the_fleet_knows_are_refused(
    server: LabellingVllmServer, tmp_path: Path
) -> None:
    """A server labelling tokens one version ahead of the fleet: every answer is refused."""
    server.label_offset = 1
    engine = engine_on([server], tmp_path)
    try:
        with pytest.raises(EngineError, match="request failed after 3 attempts"):
            asyncio.run(engine.generate([1, 2, 3], sampling_params(max_new_tokens=5)))
        assert engine.stats()["stale_refusals"] >= 1
    finally:
        engine.shutdown()


def test_a_vllm_server_without_labels_is_refused_under_in_flight(tmp_path: Path) -> None:
    fake = PausingVllmServer()
    try:
        with pytest.raises(EngineError, match="rollout.weight_update=in_flight needs servers"):
            engine_on([fake], tmp_path, startup_timeout_s=0.5)
    finally:
        fake.close()


@pytest.mark.parametrize("mode", ["drain", "resubmit"])
def test_drain_and_resubmit_keep_the_completions_path(
    server: LabellingVllmServer, tmp_path: Path, mode: str
) -> None:
    engine = engine_on([server], tmp_path, mode)
    try:
        job = Background(engine, 1, max_new_tokens=10)
        wait_until(lambda: server.in_progress() >= 2)
        update(engine, 1)
        (res,) = job.join()
    finally:
        engine.shutdown()
    assert len(res.token_ids) == 10 and not server.generated
    assert gen.UPDATE_WEIGHT_VERSION not in server.pauses and server.label == "default"


def test_a_server_whose_load_fails_mid_update_has_its_requests_retried_elsewhere(
    tmp_path: Path,
) -> None:
    """Its frozen requests are aborted before it resumes (none runs on weights frlab could
    not verify), and fail over to the other server, where they run whole."""
    servers = [LabellingVllmServer(step_s=0.02), LabellingVllmServer(step_s=0.02)]
    engine = engine_on(servers, tmp_path)
    try:
        job = Background(engine, 2, max_new_tokens=20)
        wait_until(lambda: all(s.in_progress() >= 3 for s in servers))
        servers[0].version_lie = 7  # reports a version it does not hold: refused
        update(engine, 1)
        assert engine.servers[0].state in ("stale", "dead") and engine.servers[1].state == "ok"
        results = job.join()
    finally:
        engine.shutdown()
        for s in servers:
            s.close()
    assert all(len(r.token_ids) == 20 and r.finish_reason == "length" for r in results)
    assert servers[0].generated[0].aborted and proto.ABORT_REQUESTS in servers[0].pauses
    assert all(min(r.versions) >= 0 for r in results) and engine.version == 1


def answer_with(spans: Any, n: int = 3) -> dict[str, Any]:
    out = generate_response([1], list(range(n)), [-0.5] * n, [0] * n, "length", "r")
    out["choices"][0]["weight_versions"] = spans
    return out


@pytest.mark.parametrize(
    "spans",
    [
        None,  # no label reported
        [{"version": "default", "start": 0, "end": 3}],  # the label was never set
        [{"version": "0", "start": 0, "end": 2}],  # covers 2 of 3 tokens
        [{"version": "0", "start": 0, "end": 2}, {"version": "1", "start": 1, "end": 3}],
        [{"version": "0", "start": 1, "end": 3}],  # a gap at the start
    ],
)
def test_spans_that_do_not_label_every_token_exactly_are_malformed(spans: Any) -> None:
    with pytest.raises(proto.MalformedResponse):
        gen.parse_generate(answer_with(spans))


def test_spans_give_one_version_per_token() -> None:
    spans = [{"version": "4", "start": 0, "end": 1}, {"version": "5", "start": 1, "end": 3}]
    done = gen.parse_generate(answer_with(spans))
    assert done.versions == [4, 5, 5] and done.token_ids == [0, 1, 2]
    assert version_spans([4, 5, 5]) == spans and version_spans([]) == []


class ServeLike(LabellingVllmServer):
    """A server that reports its own weight-update mode in /server_info, as frlab.serve does."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    def get(self, path: str) -> Any:
        answer = super().get(path)
        if path == "/server_info":
            answer = {**answer, proto.WEIGHT_UPDATE_FIELD: self.mode}
        return answer


@pytest.mark.parametrize(
    ("kinds", "chosen"),
    [
        (("labels", "labels"), "in_flight"),
        (("labels", "plain"), "drain"),
        (("serve:in_flight", "labels"), "in_flight"),
        (("serve:drain", "labels"), "drain"),
    ],
)
def test_the_default_is_in_flight_only_where_every_server_labels_tokens(
    kinds: tuple[str, str], chosen: str, tmp_path: Path
) -> None:
    """`rollout.weight_update=null` chooses at start: in_flight when every server labels each
    token's version (vLLM with labels, frlab.serve in its in_flight mode), else drain."""
    servers = [
        LabellingVllmServer()
        if k == "labels"
        else PausingVllmServer()
        if k == "plain"
        else ServeLike(k.split(":")[1])
        for k in kinds
    ]
    try:
        engine = engine_on(servers, tmp_path, mode=None)
        try:
            assert engine.weight_update == chosen
            assert engine.stats()["servers_healthy"] == 2
            res = asyncio.run(engine.generate([1, 2, 3], sampling_params(max_new_tokens=3)))
            assert res.versions == [0] * 3
        finally:
            engine.shutdown()
    finally:
        for server in servers:
            server.close()


def test_a_lora_fleet_defaults_to_drain(server: LabellingVllmServer, tmp_path: Path) -> None:
    engine = remote_engine(
        [server.url],
        snapshot_dir=str(tmp_path),
        lora={"r": 8, "frlab_adapter_name": "default"},
        initial_weights={"x.lora_A.default.weight": WEIGHTS["w"]},
    )
    assert engine._auto_mode and engine.weight_update == "drain"
