"""frlab's NCCL weight sync against vLLM's own weight-transfer classes (every supported
release: both shapes of its `WeightSource`): `NCCLTrainerInitInfo` built with frlab's
arguments, frlab's source driven round after round by vLLM's own trainer engine and its
metadata/iteration check, and every body the learner sends parsed by vLLM's worker-side
`parse_init_info` / `parse_update_info` behind vLLM's own weight-transfer router
(serve/dev/rlhf up to 0.31, rl/online since 0.32). The NCCL broadcast itself needs GPUs."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from frlab.rollout.remote import control
from frlab.rollout.remote import protocol as proto
from frlab.rollout.remote.nccl import FleetClient
from frlab.rollout.vllm.nccl import load_trainer_api, make_source

pytestmark = pytest.mark.vllm_contract

NAMED = [("embed.weight", torch.randn(4, 3)), ("norm.weight", torch.ones(3, dtype=torch.bfloat16))]


class WorkerSideClient:
    """The engine client behind vLLM's RLHF router: parses what arrives as vLLM's worker does."""

    def __init__(self) -> None:
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        self.engine = SimpleNamespace(
            init_info_cls=NCCLWeightTransferEngine.init_info_cls,
            update_info_cls=NCCLWeightTransferEngine.update_info_cls,
        )
        self.parsed: list = []
        self.vllm_config = SimpleNamespace(
            parallel_config=SimpleNamespace(world_size_across_dp=2, world_size=2)
        )

    async def init_weight_transfer_engine(self, request) -> None:  # noqa: ANN001
        from vllm.distributed.weight_transfer.base import WeightTransferEngine

        self.parsed.append(WeightTransferEngine.parse_init_info(self.engine, request.init_info))

    async def start_weight_update(self) -> None:
        self.parsed.append("start")

    async def update_weights(self, request) -> None:  # noqa: ANN001
        from vllm.distributed.weight_transfer.base import WeightTransferEngine

        self.parsed.append(WeightTransferEngine.parse_update_info(self.engine, request.update_info))

    async def finish_weight_update(self, weight_version=None) -> None:  # noqa: ANN001
        self.parsed.append(("finish", weight_version))


@pytest.fixture
def rlhf():  # noqa: ANN201
    from fastapi.testclient import TestClient
    from helpers.vllm_contract import router_app

    client = WorkerSideClient()
    return client, TestClient(router_app(client, "dev.rlhf"), raise_server_exceptions=False)


class RecordingClient:
    """vLLM's `VLLMWeightSyncClient` protocol, recording what the trainer engine sends."""

    def __init__(self) -> None:
        self.calls: list = []

    def init_weight_transfer_engine(self, init_info) -> None:  # noqa: ANN001
        self.calls.append(("init", init_info))

    def start_weight_update(self) -> None:
        self.calls.append(("start",))

    def update_weights(self, update_info) -> None:  # noqa: ANN001
        self.calls.append(("update", update_info))

    def finish_weight_update(self, weight_version=None) -> None:  # noqa: ANN001
        self.calls.append(("finish", weight_version))


def test_vllms_trainer_engine_sends_frlabs_source_round_after_round(monkeypatch) -> None:  # noqa: ANN001
    """vLLM's own NCCL trainer engine (`trainer_init`, `send_weights`, its metadata-vs-
    iteration check) drives frlab's source for two pushes, as `NcclSync` uses it (one source,
    `set` before each push). Only the NCCL transport is replaced: the trainer endpoint and the
    packed broadcast producer, which here drains what vLLM's check yields. On 0.33 the
    metadata is read at `trainer_init` (before any weights are set) and a round whose
    metadata is unchanged sends empty update-info lists."""
    from vllm.distributed.weight_transfer import nccl_engine

    sent: list = []

    def producer(iterator, post_iter_func, **_):  # noqa: ANN001, ANN003
        sent.append([(name, post_iter_func((name, t)).clone()) for name, t in iterator])

    monkeypatch.setattr(nccl_engine, "open_trainer_endpoint", lambda info: object())
    monkeypatch.setattr(nccl_engine, "packed_nccl_broadcast_producer", producer)
    api = load_trainer_api()
    assert api.init_info_cls is nccl_engine.NCCLTrainerInitInfo
    info = api.init_info_cls(
        master_address="10.0.0.5", master_port=29500, world_size=3, packed=True, rank=0
    )  # as NcclSync._form does
    assert info.is_sender and info.backend == "nccl"
    source, client = make_source(api), RecordingClient()
    trainer = api.factory.trainer_init(info, client=client, source=source)
    assert client.calls[0][0] == "init" and client.calls[0][1]["world_size"] == 3
    second = [(n, t + 1) for n, t in NAMED]
    for named in (NAMED, second):
        source.set(named)
        trainer.send_weights()
        source.set([])
    assert [[n for n, _ in push] for push in sent] == [[n for n, _ in NAMED]] * 2
    for push, named in zip(sent, (NAMED, second), strict=True):
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(push, named, strict=True))
    updates = [c[1] for c in client.calls if c[0] == "update"]
    assert updates[0]["names"] == [n for n, _ in NAMED]
    assert updates[0]["dtype_names"] == ["float32", "bfloat16"]
    if callable(getattr(api.source_base, "iter_full", None)):  # 0.33: "reuse the last"
        assert updates[1] == {"names": [], "dtype_names": [], "shapes": []}
    else:
        assert updates[1] == updates[0]
    assert [c[0] for c in client.calls[1:]] == ["start", "update", "finish"] * 2


def test_every_body_the_learner_sends_parses_on_the_worker_side(rlhf) -> None:  # noqa: ANN001
    """The init body (vLLM's trainer engine builds it: asdict of NCCLWeightTransferInitInfo,
    frlab's FleetClient sets each server's rank_offset) and the update body (asdict of
    NCCLWeightTransferUpdateInfo) parse; the bodies the tests spell out parse; the update
    body frlab used to spell (with `packed`) is refused."""
    from helpers import nccl  # the bodies spelled out, as the CPU fakes use them
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo

    client, http = rlhf
    fleet = FleetClient(["http://s0", "http://s1"], [1, 3], timeout=5.0)
    posted: list = []
    fleet._fan_out = lambda path, bodies: posted.extend((path, b) for b in bodies)
    worker_info = NCCLWeightTransferInitInfo(
        master_address="10.0.0.5", master_port=29500, rank_offset=1, world_size=5, packed=True
    )
    fleet.init_weight_transfer_engine(dataclasses.asdict(worker_info))
    fleet.start_weight_update()
    update = NCCLWeightTransferUpdateInfo(
        names=[n for n, _ in NAMED], dtype_names=["float32", "bfloat16"], shapes=[[4, 3], [3]]
    )
    fleet.update_weights(dataclasses.asdict(update))
    fleet.weight_version = "7"
    fleet.finish_weight_update()
    posted += [
        (proto.INIT_WEIGHT_TRANSFER, nccl.nccl_init_request("10.0.0.5", 29500, 5, 1)),
        (proto.UPDATE_WEIGHTS, nccl.nccl_update_request(NAMED)),
    ]
    for path, body in posted:
        assert http.post(path, json=body).status_code == 200, (path, body)
    inits = [p for p in client.parsed if isinstance(p, NCCLWeightTransferInitInfo)]
    assert [i.rank_offset for i in inits] == [1, 3, 1] and all(i.packed for i in inits)
    updates = [p for p in client.parsed if isinstance(p, NCCLWeightTransferUpdateInfo)]
    assert len(updates) == 3 and updates[-1].dtype_names == ["float32", "bfloat16"]
    assert client.parsed.count(("finish", "7")) == 2
    old = {"update_info": {**nccl.nccl_update_request(NAMED)["update_info"], "packed": True}}
    assert http.post(proto.UPDATE_WEIGHTS, json=old).status_code != 200  # parse_update_info refuses
    assert control.world_size_of(http.get(proto.WORLD_SIZE).json()) == 2
