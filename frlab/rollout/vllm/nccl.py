"""vLLM's trainer-side NCCL weight-transfer API as frlab uses it: the pieces frlab imports from
vLLM (`WeightTransferTrainerFactory`, `NCCLTrainerInitInfo`, `WeightSource`, `ParamMeta`), and
a `WeightSource` over the learner's tensors in both shapes vLLM's base class has had. The
remote engine's NCCL sync (frlab.rollout.remote.nccl) drives them; vllm is imported here only
when `load_trainer_api` is called (weight_sync=nccl chosen).

The `vllm_contract` tests build vLLM's real `NCCLTrainerInitInfo` and subclass its real
`WeightSource` with `make_source`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from frlab.rollout.engine import EngineError
from frlab.rollout.vllm.releases import SUPPORTED


@dataclass(frozen=True)
class TrainerApi:
    """The pieces of vLLM's trainer-side weight-transfer API frlab uses."""

    factory: Any  # WeightTransferTrainerFactory
    init_info_cls: Any  # NCCLTrainerInitInfo
    source_base: Any  # WeightSource
    param_meta: Any  # ParamMeta


def load_trainer_api() -> TrainerApi:
    """Import vLLM's trainer API (EngineError naming rollout.remote.weight_sync if absent)."""
    try:
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo
    except ImportError as exc:
        raise EngineError(
            "rollout.remote.weight_sync=nccl needs vLLM's trainer-side weight transfer API "
            f"({SUPPORTED}: WeightTransferTrainerFactory, NCCLTrainerInitInfo); the "
            f"installed vllm lacks it ({exc}); use weight_sync=filesystem"
        ) from exc
    if not callable(getattr(WeightTransferTrainerFactory, "trainer_init", None)):
        raise EngineError(
            "rollout.remote.weight_sync=nccl: the installed vllm has no "
            "WeightTransferTrainerFactory.trainer_init; use weight_sync=filesystem"
        )
    return TrainerApi(WeightTransferTrainerFactory, NCCLTrainerInitInfo, WeightSource, ParamMeta)


def build_source(api: TrainerApi) -> Any:
    """`make_source`, with a base class that refuses frlab's source (a vLLM release whose
    `WeightSource` contract changed again) reported as EngineError naming the setting."""
    try:
        return make_source(api)
    except TypeError as exc:
        raise EngineError(
            "rollout.remote.weight_sync=nccl: the installed vLLM's WeightSource refuses "
            f"frlab's weight source ({exc}); use weight_sync=filesystem"
        ) from exc


def make_source(api: TrainerApi) -> Any:
    """A vLLM `WeightSource` over the (name, tensor) pairs last given to `set`, each moved to
    the current CUDA device (NCCL sends from GPU memory) when there is one.

    Two shapes of vLLM's base class, told apart by what it offers: up to 0.32 `metadata()` is
    a method and the engine iterates the source (`__iter__`); from 0.33 `metadata` must be a
    `functools.cached_property` (the base class refuses a subclass otherwise, when the class
    is created) and the engine calls `iter_full()`. The 0.33 engine reads `metadata` already
    in `trainer_init`, when no weights are set, and caches it, so `set` drops the cached value
    for every push; an unchanged metadata list then lets vLLM send an empty update info
    ("reuse the last metadata"), which its workers accept."""
    modern = callable(getattr(api.source_base, "iter_full", None))

    class StateSource(api.source_base):  # type: ignore[misc, valid-type]
        named: list[tuple[str, torch.Tensor]] = []

        def set(self, named: list[tuple[str, torch.Tensor]]) -> None:
            self.named = named
            self.__dict__.pop("metadata", None)  # the cached_property's value (0.33+)

        def _metadata(self) -> list[Any]:
            return [api.param_meta(n, t.dtype, tuple(t.shape)) for n, t in self.named]

        def _pairs(self) -> Iterator[tuple[str, torch.Tensor]]:
            cuda = torch.cuda.is_available()
            for name, tensor in self.named:
                t = tensor.detach()
                yield name, (t.to(torch.cuda.current_device()) if cuda else t).contiguous()

        if modern:
            metadata = functools.cached_property(_metadata)
            iter_full = _pairs
        else:
            metadata = _metadata
            __iter__ = _pairs

    return StateSource()
