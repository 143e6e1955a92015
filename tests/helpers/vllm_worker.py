"""A fake vLLM worker with frlab's worker extension mixed in, shared by the in-process engine
and the server-fleet tests. It has what frlab's extension uses of vLLM's `Worker`
(vllm/v1/worker/gpu_worker.py): `reload_weights(weights_iterator=..., weights_path=...,
is_checkpoint_format=True)`, `get_model()` and `weight_transfer_engine.model`. The
`vllm_contract` tier runs the extension on vLLM's real worker class instead.

`msgspec_transport(value)`: what `collective_rpc` arguments look like in vLLM's engine-core
process. vLLM encodes them with `MsgpackEncoder` (vllm/v1/serial_utils.py) and the core's
generic `MsgpackDecoder` decodes them untyped: tuples become lists, a tensor becomes
`[dtype, shape, data]` where data is the raw bytes of a tensor under 256 bytes and, for a
larger one, the index of a side buffer the decoder never turns back into a tensor
(tests/vllm_contract/test_rpc_contract.py checks it against vLLM's own code).
"""

from __future__ import annotations

import types
from typing import Any

import torch

from frlab.rollout.vllm.worker_extension import WeightUpdateExtension

INLINE_BYTES = 256  # vLLM's VLLM_MSGPACK_ZERO_COPY_THRESHOLD default


def msgspec_transport(value: Any, _aux: list[int] | None = None) -> Any:
    """`value` as vLLM's engine core receives it in a `collective_rpc` (see the docstring)."""
    aux = [0] if _aux is None else _aux  # buffer 0 is the message itself
    if isinstance(value, torch.Tensor):
        dtype, shape = str(value.dtype).removeprefix("torch."), list(value.shape)
        if value.nbytes < INLINE_BYTES:
            return [dtype, shape, value.contiguous().view(torch.uint8).numpy().tobytes()]
        aux[0] += 1
        return [dtype, shape, aux[0]]
    if isinstance(value, tuple | list):
        return [msgspec_transport(v, aux) for v in value]
    if isinstance(value, dict):
        return {k: msgspec_transport(v, aux) for k, v in value.items()}
    return value


class FakeModel:
    """The served model: `load_weights` keeps a copy of every tensor it is given."""

    def __init__(self) -> None:
        self.params: dict[str, torch.Tensor] = {}

    def load_weights(self, weights: Any) -> set[str]:
        weights = list(weights)
        for name, tensor in weights:
            self.params[name] = tensor.detach().clone()
        return {name for name, _ in weights}


class FakeWorker(WeightUpdateExtension):
    """vLLM's worker class with frlab's extension mixed in: `reload_weights` as
    `Worker.reload_weights` (keywords `weights_iterator`, `is_checkpoint_format`) loads
    through the model's `load_weights`; `weight_transfer_engine.model` is the same model."""

    def __init__(self) -> None:
        self.model = FakeModel()
        self.weight_transfer_engine = types.SimpleNamespace(model=self.model)
        self.model_runner = types.SimpleNamespace(model=self.model)  # as vLLM's Worker has
        self.reloads: list[bool] = []

    def reload_weights(
        self,
        weights_iterator: Any = None,
        weights_path: Any = None,
        is_checkpoint_format: bool = True,
    ) -> None:
        self.reloads.append(is_checkpoint_format)
        self.model.load_weights(weights_iterator)

    def get_model(self) -> FakeModel:
        return self.model


def fake_worker() -> FakeWorker:
    return FakeWorker()


def vllm_router_answer(results: list[Any] | None) -> Any:
    """What vLLM's dev router `POST /collective_rpc` answers for these worker results
    (vllm/entrypoints/serve/dev/rpc/api_router.py): None -> an empty 200 body (None here);
    else `{"results": [...]}` with dicts, lists and None as they are, anything else as
    `str(result)`. Written from vLLM's source independently of frlab's `rpc_answer`; the
    `vllm_contract` tier checks both against the router itself."""
    if results is None:
        return None
    return {"results": [r if r is None or isinstance(r, dict | list) else str(r) for r in results]}


def vllm_server_info(logprobs_mode: str) -> dict[str, Any]:
    """The part of vLLM's `GET /server_info?config_format=json` answer frlab reads."""
    return {
        "vllm_config": {"model_config": {"logprobs_mode": logprobs_mode}},
        "vllm_env": {},
        "system_env": {},
    }
