"""The weights-in side of the `vllm` engine (frlab.rollout.vllm.engine): write an update to
disk, load it on vLLM's workers as `weight_update` says, label the tokens that follow.

A full-weight update is a safetensors snapshot loaded by frlab's worker extension
(`collective_rpc("frlab_load_snapshot", args=(path, version, fingerprint))`; a path survives
vLLM's msgspec transport, tensors in rpc arguments do not), acknowledged by every worker with
the version and a fingerprint of what it loaded. A LoRA engine's update is the adapter only,
a peft folder loaded with vLLM's `add_lora` in place (frlab.rollout.vllm.lora). Any
failure while loading breaks the engine: its weights may be mixed, so it refuses requests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import torch

from frlab.rollout.engine import EngineError
from frlab.rollout.vllm.lora import adapter_request, prune_adapters, write_adapter
from frlab.rollout.vllm.snapshot import prune_snapshots, write_snapshot
from frlab.rollout.vllm.worker_extension import SNAPSHOT_METHOD, check_acks


class WeightsSide:
    """`update_weights` of `VLLMEngine`, and the loading of its first adapter."""

    lora: dict[str, Any] | None
    snapshot_dir: str | None
    weight_update: str | None
    _own_dir: str | None
    _engine: Any
    _vllm: Any
    _version: int
    _labels: bool
    _broken: str | None
    _updating: bool
    _aborts: int
    _lora_request: Any
    _update_lock: asyncio.Lock

    _call: Callable[[Any], Any]  # VLLMEngine._call: run a coroutine on the engine loop
    _refresh_gate: Callable[[], None]  # VLLMEngine._refresh_gate
    _drain: Callable[[], Awaitable[None]]  # VLLMEngine._drain: until no request is in flight

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Write `state_dict` (HF names; a LoRA engine: the adapter's tensors only) and load it
        on every worker the way `weight_update` says (frlab.rollout.vllm.engine), then bump
        the version."""
        if int(version) < 0:
            raise ValueError(f"update_weights version must be >= 0, got {version}")
        if not state_dict:
            raise ValueError("update_weights got an empty state_dict")
        written = self._write(state_dict, int(version))
        self._call(self._update(written, int(version)))
        folder = self.snapshot_dir or self._own_dir
        if self.lora is not None:  # requests name the adapter's folder: keep it
            prune_adapters(folder, keep=2)
        else:  # every worker has loaded it (or the engine is broken)
            prune_snapshots(folder, keep=1)

    async def _update(self, written: tuple[Any, Any], version: int) -> None:
        async with self._update_lock:
            if self._broken is not None:
                raise EngineError(self._broken)
            mode = self.weight_update
            self._updating = True
            if mode != "in_flight":
                self._refresh_gate()  # new requests wait for the new weights
            try:
                if mode == "drain":
                    await self._drain()
                else:  # keep: frozen between steps; abort: ended, their tokens returned
                    self._aborts += mode == "resubmit"
                    await self._engine.pause_generation(
                        mode="keep" if mode == "in_flight" else "abort",
                        clear_cache=mode == "resubmit",
                    )
                await self._load(written, version, reset=mode == "drain")
                self._version = version
            finally:
                self._updating = False
                if mode != "drain" and self._broken is None:
                    await self._engine.resume_generation()
                self._refresh_gate()

    async def _load(self, written: tuple[Any, Any], version: int, reset: bool) -> None:
        """Load on the workers and label what follows; any failure marks the engine broken
        (its weights may be mixed) and ends every request it holds."""
        path, sent = written
        try:
            if self.lora is not None:
                await self._add_adapter(path)
            else:
                acks = await self._engine.collective_rpc(
                    SNAPSHOT_METHOD, args=(str(path), version, dict(sent))
                )
                check_acks(acks, version, sent)
            if self._labels:
                await self._engine.update_weight_version(str(version))
            if reset:  # no request runs: cached KV of the old weights must go
                answer = await self._engine.reset_prefix_cache()
                if answer is not True:
                    raise EngineError(f"vLLM's prefix-cache reset answered {answer!r}, not True")
        except Exception as exc:
            self._broken = (
                f"vLLM weight update to version {version} failed ({exc}); the engine's weights "
                "may be partly updated, so it refuses further requests: restart it"
            )
            with contextlib.suppress(Exception):  # frozen requests must end, not hang
                await self._engine.pause_generation(mode="abort")
            raise EngineError(self._broken) from exc

    def _write(self, state_dict: Mapping[str, torch.Tensor], version: int) -> Any:
        """The update of `version` on disk: a peft adapter folder (LoRA), else a snapshot
        file; (path, fingerprint of what was sent; None for an adapter)."""
        folder = self.snapshot_dir or self._own_dir
        if folder is None:
            raise EngineError("VLLMEngine is not running: call start() first")
        if self.lora is not None:
            return write_adapter(state_dict, self.lora, folder, version), None
        return write_snapshot(state_dict, folder, version)

    async def _add_adapter(self, path: Any) -> None:
        """Load the adapter folder at `path` in place of the one served
        (frlab.rollout.vllm.lora)."""
        loaded = await self._engine.add_lora(adapter_request(self._vllm, path, load_inplace=True))
        if loaded is not True:
            raise EngineError(f"vLLM's add_lora of the adapter {path} answered {loaded!r}")
        self._lora_request = adapter_request(self._vllm, path, load_inplace=False)
