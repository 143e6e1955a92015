"""Fakes for the NCCL weight sync of the remote engine (frlab.rollout.remote.nccl), no vllm needed.

`install_fake_vllm(monkeypatch, api=...)` puts fake `vllm.distributed.weight_transfer.{base,
factory,nccl_engine}` modules into `sys.modules`, shaped like vLLM's trainer API
(`WeightTransferTrainerFactory.trainer_init(NCCLTrainerInitInfo(..., rank=0), client=,
source=)`, `send_weights()`, `shutdown()`) of 0.28-0.32 (`api="0.28"`: `WeightSource.metadata()`
a method, the source iterated) or of 0.33 (`metadata` a cached property checked when the
subclass is created, `iter_full()`, metadata read at `trainer_init`, empty update-info lists
when it is unchanged); read from those wheels' base.py / nccl_engine.py. The fake "broadcast" puts
the source's tensors on
`WIRE[master_port]`, then drives the client like vLLM does (start, update, finish).

`FakeVllmServer` is an HTTP server on a thread with vLLM's routes the remote engine uses,
answering as vLLM 0.28/0.29 does (read from its sources; the `vllm_contract` tier checks the
same rules against vLLM's own code): `GET /health` 200 with an EMPTY body; `POST
/collective_rpc` results through vLLM's router rule (dicts, lists and None as they are,
anything else as `str(result)`: `vllm_router_answer`); `POST /reset_prefix_cache` ->
`{"success": bool}`; `GET /server_info` -> the config's `logprobs_mode`; init and update infos
parsed with exactly the fields of vLLM's `NCCLWeightTransferInitInfo` /
`NCCLWeightTransferUpdateInfo` (any other key is a worker error: HTTP 500). Each of its
workers is a real `WeightUpdateExtension` on a fake worker whose `reload_weights` loads into
a fake model keeping copies. `/update_weights` "receives" the wire's tensors and loads them
on every worker, so the frlab rpcs (join, begin, commit, version) run unchanged. Every
request is logged to `EVENTS` as (what, server url, detail).
"""

from __future__ import annotations

import functools
import json
import sys
import threading
import types
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
import torch

from frlab.rollout.remote import protocol as proto
from helpers.vllm_worker import (  # noqa: F401 (FakeModel, FakeWorker re-exported)
    FakeModel,
    FakeWorker,
    fake_worker,
    vllm_router_answer,
    vllm_server_info,
)

WIRE: dict[int, list[tuple[str, torch.Tensor]]] = {}
EVENTS: list[tuple[str, str, Any]] = []
TOKENS = [7, 8]
LOG_PROBS = [-0.5, -0.25]


# vLLM's worker-side NCCL info fields (vllm/distributed/weight_transfer/nccl_common.py
# NCCLWeightTransferInitInfo, nccl_engine.py NCCLWeightTransferUpdateInfo): a dict with any
# other key fails `parse_init_info` / `parse_update_info` (a TypeError turned ValueError).
INIT_FIELDS = {
    "master_address",
    "master_port",
    "rank_offset",
    "world_size",
    "packed",
    "packed_buffer_size_bytes",
    "packed_num_buffers",
}
INIT_REQUIRED = {"master_address", "master_port", "rank_offset", "world_size"}
UPDATE_FIELDS = {"names", "dtype_names", "shapes"}


def parse_info(info: dict[str, Any], fields: set[str], required: set[str]) -> dict[str, Any]:
    """What `WeightTransferEngine.parse_*_info` accepts: exactly the dataclass's fields."""
    extra, missing = set(info) - fields, required - set(info)
    if extra or missing:
        raise ValueError(f"Invalid info: unexpected {sorted(extra)}, missing {sorted(missing)}")
    return info


def nccl_init_request(
    master_address: str,
    master_port: int,
    world_size: int,
    rank_offset: int = 1,
    packed: bool = True,
) -> dict[str, Any]:
    """`POST /init_weight_transfer_engine` body as vLLM's trainer engine sends it (the trainer
    is rank 0 of the NCCL group; `packed` is a wire parameter of the init info)."""
    if int(world_size) < 2 or not 0 < int(rank_offset) < int(world_size):
        raise ValueError("NCCL weight transfer needs world_size >= 2 and 0 < rank_offset < it")
    info = {
        "master_address": str(master_address),
        "master_port": int(master_port),
        "rank_offset": int(rank_offset),
        "world_size": int(world_size),
        "packed": bool(packed),
    }
    return {"init_info": info}


def nccl_update_request(named_tensors: Sequence[tuple[str, torch.Tensor]]) -> dict[str, Any]:
    """`POST /update_weights` body as vLLM's trainer engine sends it: names, dtypes and shapes
    in the order they are broadcast (exactly the fields of `NCCLWeightTransferUpdateInfo`)."""
    if not named_tensors:
        raise ValueError("nothing to send: the state dict is empty")
    names = [str(n) for n, _ in named_tensors]
    dtypes = [str(t.dtype).removeprefix("torch.") for _, t in named_tensors]
    shapes = [list(t.shape) for _, t in named_tensors]
    return {"update_info": {"names": names, "dtype_names": dtypes, "shapes": shapes}}


class Refused(Exception):
    """Answer the request with HTTP `status` and `body` (a 4xx of vLLM's app)."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(status)
        self.status, self.body = status, body


class FakeVllmServer:
    """A vLLM-like server with `n_workers` frlab-extended workers (see the module docstring)."""

    def __init__(self, n_workers: int = 1) -> None:
        self.n_workers = n_workers
        self.workers = [fake_worker() for _ in range(n_workers)]
        self.corrupt = False  # add 1 to the first received tensor
        self.version_lie: int | None = None  # answer frlab_weight_version with this
        self.down = False  # answer every request with HTTP 503
        self.logprobs_mode = "processed_logprobs"
        self.reset_ok = True  # what /reset_prefix_cache reports
        self.master_port: int | None = None
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def restart(self) -> None:
        """A new process: fresh workers that hold no weights and know no NCCL group."""
        self.workers = [fake_worker() for _ in range(self.n_workers)]
        self.master_port = None
        self.__dict__.pop("last_info", None)  # a new process reuses no update info

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def get(self, path: str) -> Any:
        if path == proto.HEALTH:
            return b""  # vLLM: 200, empty body
        if path == "/server_info":
            return vllm_server_info(self.logprobs_mode)
        if path == proto.MODELS:
            return {"object": "list", "data": [{"id": "fake", "object": "model"}]}
        if path == proto.WORLD_SIZE:
            return {"world_size": self.n_workers}
        raise KeyError(path)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        EVENTS.append((path, self.url, body))
        if path == proto.COLLECTIVE_RPC:
            return self.rpc(body["method"], body.get("args", []))
        if path == proto.RESET_PREFIX_CACHE:
            return {"success": self.reset_ok}
        if path == proto.INIT_WEIGHT_TRANSFER:
            info = parse_info(body["init_info"], INIT_FIELDS, INIT_REQUIRED)
            self.master_port = int(info["master_port"])
        elif path == proto.UPDATE_WEIGHTS:
            self.receive(parse_info(body["update_info"], UPDATE_FIELDS, UPDATE_FIELDS))
        elif path == proto.COMPLETIONS:
            answer = proto.completion_response(
                "fake", body["prompt"], TOKENS, LOG_PROBS, [0, 0], "length", "r"
            )
            del answer["choices"][0][proto.VERSIONS_FIELD]  # vLLM sends no versions
            return answer
        return {}

    def rpc(self, method: str, args: list[Any]) -> Any:
        if method == "frlab_weight_version" and self.version_lie is not None:
            return vllm_router_answer([{"version": self.version_lie}] * self.n_workers)
        return vllm_router_answer([getattr(w, method)(*args) for w in self.workers])

    def receive(self, info: dict[str, Any]) -> None:
        """The workers' side of the broadcast: what the update info declares, from the wire.
        Empty lists reuse the last update info this server received (vLLM 0.33's workers);
        a server with none to reuse fails (HTTP 500)."""
        wire = WIRE[self.master_port]  # KeyError (HTTP 500) if this server never joined
        if not info["names"] and not info["dtype_names"] and not info["shapes"]:
            info = self.last_info  # AttributeError (HTTP 500) if there is none
        self.last_info = info
        declared = (info["names"], info["dtype_names"], info["shapes"])
        sent = (
            [n for n, _ in wire],
            [str(t.dtype).removeprefix("torch.") for _, t in wire],
            [list(t.shape) for _, t in wire],
        )
        assert declared == sent, (declared, sent)
        got = [(n, t.clone()) for n, t in wire]
        if self.corrupt:
            got[0] = (got[0][0], got[0][1] + 1)
        for worker in self.workers:
            worker.weight_transfer_engine.model.load_weights(got)  # through frlab's tap


def _handler(server: FakeVllmServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if server.down:
                return self._answer(503, {"error": "down"})
            try:
                self._answer(200, server.get(self.path.split("?")[0]))
            except KeyError:
                self._answer(404, {"error": self.path})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if server.down:
                return self._answer(503, {"error": "down"})
            try:
                self._answer(200, server.post(self.path, body))
            except Refused as exc:  # what vLLM's app answers a request it refuses
                self._answer(exc.status, exc.body)
            except Exception as exc:  # a worker error: vLLM answers 500
                self._answer(500, {"error": repr(exc)})

        def _answer(self, status: int, body: Any) -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            kind = "text/plain" if isinstance(body, bytes) and body else "application/json"
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


# -- fake vllm trainer API --------------------------------------------------------------------
@dataclass(frozen=True)
class ParamMeta:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


class WeightSource(ABC):
    """vLLM 0.28-0.32 (vllm/distributed/weight_transfer/base.py): `metadata()` is a method,
    the engine iterates the source."""

    @abstractmethod
    def metadata(self) -> list[ParamMeta]: ...

    @abstractmethod
    def __iter__(self) -> Any: ...


class WeightSource033(ABC):
    """vLLM 0.33's: `metadata` an abstract property that a subclass must implement as a
    `functools.cached_property` (refused with TypeError when the class is created),
    `iter_full()` the full tensors, `implements_iter_full()` whether a subclass has it."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        metadata = cls.__dict__.get("metadata")
        if metadata is not None and not isinstance(metadata, functools.cached_property):
            raise TypeError(f"{cls.__name__}.metadata must be a functools.cached_property")

    @property
    @abstractmethod
    def metadata(self) -> list[ParamMeta]: ...

    def implements_iter_full(self) -> bool:
        return type(self).iter_full is not WeightSource033.iter_full

    def iter_full(self) -> Any:
        raise NotImplementedError


@dataclass
class NCCLTrainerInitInfo:
    master_address: str
    master_port: int
    world_size: int
    packed: bool = True
    rank: int = field(default=0, kw_only=True)


class FakeTrainerEngine:
    """vLLM's NCCLTrainerWeightTransferEngine, minus NCCL: the wire is `WIRE[master_port]`."""

    fail_send = False  # class switch: the next send_weights raises after `start`

    def __init__(self, info: NCCLTrainerInitInfo, client: Any, source: Any) -> None:
        self.info, self.client, self.source = info, client, source

    @classmethod
    def trainer_init(
        cls, init_info: NCCLTrainerInitInfo, *, client: Any, source: Any = None
    ) -> FakeTrainerEngine:
        EVENTS.append(("trainer_init", "", init_info))
        worker_info = {
            "master_address": init_info.master_address,
            "master_port": init_info.master_port,
            "rank_offset": 1,
            "world_size": init_info.world_size,
            "packed": init_info.packed,
            "packed_buffer_size_bytes": 1 << 30,
            "packed_num_buffers": 2,
        }
        client.init_weight_transfer_engine(worker_info)
        return cls(init_info, client, source)

    def send_weights(self) -> None:
        meta = self.source.metadata()
        pairs = list(self.source)
        self._send(meta, pairs, self._info(meta))

    def _info(self, meta: list[ParamMeta]) -> dict[str, Any]:
        return {
            "names": [m.name for m in meta],
            "dtype_names": [str(m.dtype).split(".")[-1] for m in meta],
            "shapes": [list(m.shape) for m in meta],
        }

    def _send(self, meta: list[ParamMeta], pairs: list[Any], info: dict[str, Any]) -> None:
        assert [(m.name, m.dtype, m.shape) for m in meta] == [
            (n, t.dtype, tuple(t.shape)) for n, t in pairs
        ]
        self.client.start_weight_update()
        if FakeTrainerEngine.fail_send:
            raise RuntimeError("NCCL error: unhandled system error")
        WIRE[self.info.master_port] = pairs
        self.client.update_weights(info)
        self.client.finish_weight_update()

    def shutdown(self) -> None:
        EVENTS.append(("trainer_shutdown", "", self.info.master_port))


class FakeTrainerEngine033(FakeTrainerEngine):
    """vLLM 0.33's: `trainer_init` refuses a source without `iter_full` and reads `metadata`
    (before any weights are set: a source must not keep that value), `send_weights` reads
    `source.metadata` and `source.iter_full()`, and sends EMPTY update-info lists when the
    metadata equals the previous round's (the workers reuse their last one)."""

    @classmethod
    def trainer_init(cls, init_info: Any, *, client: Any, source: Any = None) -> Any:
        if not source.implements_iter_full():
            raise TypeError(f"{type(source).__name__} does not implement iter_full()")
        list(source.metadata)  # validated at init, as vLLM does
        engine = super().trainer_init(init_info, client=client, source=source)
        engine.sent_meta = None
        return engine

    def send_weights(self) -> None:
        meta = self.source.metadata
        pairs = list(self.source.iter_full())
        empty = {"names": [], "dtype_names": [], "shapes": []}
        self._send(meta, pairs, empty if meta == self.sent_meta else self._info(meta))
        self.sent_meta = meta


API_SHAPES = {
    "0.28": (WeightSource, FakeTrainerEngine),
    "0.33": (WeightSource033, FakeTrainerEngine033),
}


class WeightTransferTrainerFactory:
    engine: ClassVar[type] = FakeTrainerEngine

    @classmethod
    def trainer_init(cls, init_info: Any, *, client: Any, source: Any = None) -> Any:
        return cls.engine.trainer_init(init_info, client=client, source=source)


def install_fake_vllm(
    monkeypatch: pytest.MonkeyPatch, with_trainer_api: bool = True, api: str = "0.28"
) -> None:
    """Fake vllm weight-transfer modules in sys.modules, shaped as vLLM `api` (0.28: the
    0.28-0.32 trainer API; 0.33) and without the trainer API if asked."""
    source_base, engine = API_SHAPES[api]
    monkeypatch.setattr(WeightTransferTrainerFactory, "engine", engine)
    names = ["vllm", "vllm.distributed", "vllm.distributed.weight_transfer"]
    mods = {n: types.ModuleType(n) for n in names}
    base = types.ModuleType("vllm.distributed.weight_transfer.base")
    base.ParamMeta, base.WeightSource = ParamMeta, source_base  # type: ignore[attr-defined]
    factory = types.ModuleType("vllm.distributed.weight_transfer.factory")
    nccl = types.ModuleType("vllm.distributed.weight_transfer.nccl_engine")
    if with_trainer_api:
        factory.WeightTransferTrainerFactory = WeightTransferTrainerFactory  # type: ignore[attr-defined]
        nccl.NCCLTrainerInitInfo = NCCLTrainerInitInfo  # type: ignore[attr-defined]
    for mod in (*mods.values(), base, factory, nccl):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    WIRE.clear()
    EVENTS.clear()
    FakeTrainerEngine.fail_send = False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # tensors stay on CPU
