"""`collective_rpc` through vLLM's own serialisers and dev routers (vllm 0.28/0.29).

In-process (rollout/engine=vllm): `AsyncLLM.collective_rpc` ships its arguments to the
engine-core process as a UTILITY request encoded by `MsgpackEncoder`
(vllm/v1/engine/core_client.py `_call_utility_async`) and decoded by the core's untyped
`MsgpackDecoder` (vllm/v1/engine/core.py `process_input_sockets`); results come back typed as
`UtilityResult` inside `EngineCoreOutputs`. Over HTTP (rollout=remote): the dev router
`POST /collective_rpc` (vllm/entrypoints/serve/dev/rpc/api_router.py).
"""

from __future__ import annotations

import pytest
import torch
from helpers.vllm_worker import msgspec_transport, vllm_router_answer

from frlab.rollout.remote import control
from frlab.rollout.remote import protocol as proto
from frlab.rollout.vllm.worker_extension import SNAPSHOT_METHOD

pytestmark = pytest.mark.vllm_contract


def core_receives(args: tuple) -> list:
    """`args` of `collective_rpc` as vLLM's engine core decodes them."""
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    frames = MsgpackEncoder().encode((0, 1, "collective_rpc", (SNAPSHOT_METHOD, None, args, {})))
    _, _, method, (rpc_method, _, received, _) = MsgpackDecoder().decode(frames)
    assert (method, rpc_method) == ("collective_rpc", SNAPSHOT_METHOD)
    return received


def plain(value):  # noqa: ANN001, ANN201
    """memoryviews (vLLM's inline tensor data) as bytes, for comparison."""
    if isinstance(value, memoryview):
        return value.tobytes()
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def test_snapshot_rpc_arguments_survive_and_tensors_do_not() -> None:
    """what the in-process engine sends now (a path, a version, a
    fingerprint) arrives unchanged; what it used to send (tensors in the arguments) arrives as
    `[dtype, shape, buffer]` lists, never tensors."""
    sent = ("/tmp/s/v3/model.safetensors", 3, {"tensors": 2, "numel": 5, "sum": 5.25})
    assert core_receives(sent) == list(sent)
    old = ([("w", torch.arange(4.0)), ("big", torch.zeros(100))], 3)
    received = core_receives(old)
    (w_name, w), (big_name, big) = received[0]
    assert (w_name, big_name) == ("w", "big")
    assert not isinstance(w, torch.Tensor) and not isinstance(big, torch.Tensor)
    assert w[:2] == ["float32", [4]] and big[:2] == ["float32", [100]] and big[2] == 1


def test_the_test_suites_transport_fake_matches_vllms() -> None:
    """tests/helpers/async_llm.py `msgspec_transport` is what the CPU tests use
    for vLLM's transport: it must produce what vLLM's own encoder and decoder produce."""
    for args in (
        ("/p", 3, {"tensors": 1, "numel": 2, "sum": 0.5}),
        ([("w", torch.arange(4.0)), ("big", torch.ones(70, dtype=torch.float64))], 7),
        ({"a": [1, 2.5, None, "x", b"raw"]},),
    ):
        assert plain(core_receives(args)) == msgspec_transport(args)


def test_worker_acks_come_back_unchanged_from_the_engine_core() -> None:
    """A worker's dict ack returns to `AsyncLLM.collective_rpc` intact (UtilityResult)."""
    from vllm.v1.engine import EngineCoreOutputs, UtilityOutput
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder, UtilityResult

    acks = [{"version": 3, "tensors": 2, "numel": 5, "sum": 5.25}] * 2
    out = EngineCoreOutputs(utility_output=UtilityOutput(7, result=UtilityResult(acks)))
    back = MsgpackDecoder(EngineCoreOutputs).decode(MsgpackEncoder().encode(out))
    assert back.utility_output.result.result == acks


class RpcClient:
    """Stands in for vLLM's EngineClient behind the dev routers: `collective_rpc` answers
    the per-worker results it is given."""

    def __init__(self, results) -> None:  # noqa: ANN001
        self.results, self.calls = results, []

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):  # noqa: ANN001, ANN201
        self.calls.append((method, args, kwargs))
        return self.results


@pytest.mark.parametrize(
    "results",
    [[3, 3], [False], [None], [{"version": 3}, {"version": None}], [{"ready": False}], [[1]]],
)
def test_the_dev_router_stringifies_scalars_as_frlab_expects(results) -> None:  # noqa: ANN001
    """vLLM's router answers results that are not a dict, list or None
    as `str(result)`; `control.rpc_answer` (used by frlab.serve and the fakes) says the same."""
    from fastapi.testclient import TestClient
    from helpers.vllm_contract import router_app

    client = RpcClient(results)
    http = TestClient(router_app(client, "dev.rpc"))
    body = control.rpc_request("frlab_weight_version", ["/p", 3, {"sum": 1.0}], timeout=5.0)
    resp = http.post(proto.COLLECTIVE_RPC, json=body)
    assert resp.status_code == 200
    assert resp.json() == control.rpc_answer(results) == vllm_router_answer(results)
    assert client.calls == [("frlab_weight_version", ("/p", 3, {"sum": 1.0}), {})]
    if results == [3, 3]:
        with pytest.raises(proto.MalformedResponse):
            control.rpc_versions(resp.json())  # "3" is refused, not compared with 3


def test_frlab_parses_the_dev_routers_answers_of_its_own_worker_methods() -> None:
    from fastapi.testclient import TestClient
    from helpers.vllm_contract import router_app

    cases = [
        ([{"version": 4}, {"version": 4}], lambda b: control.rpc_versions(b) == [4, 4]),
        ([{"ready": False}], lambda b: control.rpc_flags(b, "ready") == [False]),
        ([{"group": "g"}], lambda b: control.rpc_dicts(b, "group") == [{"group": "g"}]),
    ]
    for results, check in cases:
        http = TestClient(router_app(RpcClient(results), "dev.rpc"))
        assert check(http.post(proto.COLLECTIVE_RPC, json=control.rpc_request("m")).json())


class HealthClient:
    def __init__(self, dead: bool) -> None:
        self.dead = dead

    async def check_health(self) -> None:
        from vllm.v1.engine.exceptions import EngineDeadError

        if self.dead:
            raise EngineDeadError()

    async def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):  # noqa: ANN001, ANN201
        return not self.dead


def test_health_is_an_empty_200_and_reset_reports_success() -> None:
    """`GET /health` answers 200 with an EMPTY body
    (vllm/entrypoints/serve/instrumentator/health.py), 503 when the engine is dead;
    `POST /reset_prefix_cache` answers `{"success": bool}` (dev/cache/api_router.py)."""
    from fastapi.testclient import TestClient
    from helpers.vllm_contract import router_app

    alive = TestClient(router_app(HealthClient(False), "health", "dev.cache"))
    resp = alive.get(proto.HEALTH)
    assert resp.status_code == 200 and resp.content == b""
    assert control.reset_succeeded(alive.post(proto.RESET_PREFIX_CACHE).json()) is True
    dead = TestClient(router_app(HealthClient(True), "health", "dev.cache"))
    assert dead.get(proto.HEALTH).status_code == 503
    assert control.reset_succeeded(dead.post(proto.RESET_PREFIX_CACHE).json()) is False


def test_frlab_serve_answers_health_and_rpcs_as_vllm_does(tmp_path) -> None:  # noqa: ANN001
    """frlab.serve imitates these endpoints: same status, same bodies."""
    import threading

    import httpx

    from frlab.serve.server import ServeState, serve

    class Engine:  # enough of TorchEngine for the control plane
        version = 5

        def start(self) -> None: ...

        def shutdown(self) -> None: ...

    state = ServeState(Engine(), "m")  # type: ignore[arg-type]
    ready = threading.Event()
    thread = threading.Thread(target=serve, args=(state, "127.0.0.1", 0, ready), daemon=True)
    thread.start()
    ready.wait(30)
    base = f"http://127.0.0.1:{state.server.server_address[1]}"
    try:
        health = httpx.get(base + proto.HEALTH, trust_env=False)
        assert health.status_code == 200 and health.content == b""
        rpc = httpx.post(
            base + proto.COLLECTIVE_RPC,
            json=control.rpc_request("frlab_weight_version"),
            trust_env=False,
        )
        assert rpc.json() == control.rpc_answer([{"version": 5}])
        reset = httpx.post(base + proto.RESET_PREFIX_CACHE, json={}, trust_env=False)
        assert reset.json() == {"success": True}
    finally:
        state.server.shutdown()
        thread.join(10)
