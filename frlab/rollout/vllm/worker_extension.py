"""Worker side of the vLLM weight sync: a worker extension that loads learner weights by name.

vLLM's V1 engine runs its GPU workers in other processes and forwards `collective_rpc`
calls to them; a Python callable is only shipped there with
`VLLM_ALLOW_INSECURE_SERIALIZATION=1`, a method NAME always is. vLLM's documented RLHF path
is therefore a worker extension class: the engine is built with
`worker_extension_cls=WORKER_EXTENSION_CLS` (`--worker-extension-cls` for `vllm serve`) and
vLLM mixes `WeightUpdateExtension` into its worker class (`WorkerWrapperBase.init_worker`
appends it to the worker class's bases and refuses any attribute name the worker already has).

Weights travel as a safetensors snapshot PATH, never as tensors in the rpc arguments: vLLM
serialises `collective_rpc` arguments to its engine-core process with its msgspec encoder
(`vllm/v1/serial_utils.py`), and a tensor nested in the arguments arrives as an untyped
`[dtype, shape, buffer index]` list without its buffer. `frlab_load_snapshot(path, version,
fingerprint)` streams the file into the worker's documented reload path,
`Worker.reload_weights(weights_iterator=..., is_checkpoint_format=True)`
(`vllm/v1/worker/gpu_worker.py`, `GPUModelRunner.reload_weights`), which runs vLLM's
post-load weight processing (kernels that repack weights: some MoE backends, quantised
models); a bare `model.load_weights` would skip it. The in-process engine
(frlab.rollout.vllm.engine) and the server fleet (frlab.rollout.remote) use the same method.

Every method returns a dict: vLLM's HTTP dev endpoint `POST /collective_rpc` answers results
that are not a dict, a list or None as `str(result)`. A load answers an acknowledgement
(`weight_ack`): the version it now holds and a fingerprint (tensor count, element count,
float64 sum) of the tensors it streamed into the model; the sender compares it with the
fingerprint of what it wrote (`check_acks`), so a sync that was dropped, truncated or
corrupted is an error rather than stale weights under a new version number. The ack cannot
compare against the served parameters, whose names differ (vLLM fuses q/k/v and gate/up).

NCCL sync (remote backend, `rollout.remote.weight_sync=nccl`): vLLM's own weight-transfer
engine receives the broadcast and calls the served model's `load_weights` inside its
layerwise reload, so frlab never sees the tensors. Three rpcs make that verifiable:
`frlab_nccl_join(token)` marks the workers of one NCCL group (a restarted server does not
know the token and answers `{"ready": false}` to the next `frlab_nccl_begin(token)`),
`frlab_nccl_begin` forgets the held version (the weights are about to change) and taps
`load_weights` to fingerprint every tensor vLLM loads, and `frlab_commit_version(version,
fingerprint)` commits the version only if what was loaded matches the learner's fingerprint
(else the worker keeps no version: stale).

This module never imports vllm (only torch and safetensors): frlab imports it to share the
fingerprint, vLLM workers import it by its qualified name. The `vllm_contract` tests mix it
into vLLM's real worker class and reload through vLLM's real `Worker.reload_weights` on CPU;
it has not run inside a vLLM worker on a GPU.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from frlab.rollout.vllm.releases import SUPPORTED


def request_amx() -> bool:
    """Ask Linux for AMX tile permission in this process (x86 CPUs with AMX). vLLM's CPU build
    runs bf16 attention with AMX instructions in its worker process, which never asks for that
    permission itself (torch's oneDNN asks only when it first uses AMX): without it the
    worker dies with SIGILL at its first bf16 request. vLLM imports this module in every
    worker (the worker extension), so the request is made there."""
    try:
        return bool(torch.cpu._is_amx_tile_supported() and torch.cpu._init_amx())
    except (AttributeError, RuntimeError):  # another torch, or no AMX: nothing to ask
        return False


request_amx()
WORKER_EXTENSION_CLS = "frlab.rollout.vllm.worker_extension.WeightUpdateExtension"
VERSION_METHOD = "frlab_weight_version"  # -> {"version": int | None}
SNAPSHOT_METHOD = "frlab_load_snapshot"  # load a safetensors snapshot file -> weight_ack
NCCL_JOIN_METHOD = "frlab_nccl_join"  # remote backend, nccl: the group token -> {"group"}
NCCL_BEGIN_METHOD = "frlab_nccl_begin"  # ... before a broadcast: tap load_weights -> {"ready"}
COMMIT_METHOD = "frlab_commit_version"  # ... after it: verify what was loaded, commit -> ack
# the folder a server reads snapshots from (set by scripts/launch/fleet.sh: the run's snapshot_dir)
SNAPSHOT_ROOT_VAR = "FRLAB_SNAPSHOT_ROOT"


def check_snapshot_path(path: str, root: str | os.PathLike[str] | None) -> str:
    """`path`, unless `root` is set and `path` (symlinks followed) lies outside it: then
    PermissionError. Without a root any path is read (a server started by hand)."""
    if root is None or str(root) == "":
        return str(path)
    real, base = os.path.realpath(path), os.path.realpath(root)
    if os.path.commonpath([real, base]) != base:
        raise PermissionError(
            f"weight snapshot {path} is outside this server's snapshot folder {root} "
            f"({SNAPSHOT_ROOT_VAR}): refused"
        )
    return str(path)


def as_named_tensors(named_tensors: Any) -> list[tuple[str, torch.Tensor]]:
    """`(name, tensor)` pairs from a mapping or a sequence of pairs. Raises TypeError /
    ValueError naming the bad entry."""
    items: Iterable[Any] = (
        named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    )
    out: list[tuple[str, torch.Tensor]] = []
    for i, pair in enumerate(items):
        if not isinstance(pair, Sequence) or isinstance(pair, str) or len(pair) != 2:
            raise TypeError(f"weights entry {i} is not a (name, tensor) pair: {type(pair)}")
        name, tensor = pair
        if not isinstance(name, str) or not name:
            raise TypeError(f"weights entry {i} has a non-string or empty name: {name!r}")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"weights entry {name!r} is {type(tensor).__name__}, not a tensor")
        out.append((name, tensor))
    if not out:
        raise ValueError("weights are empty: nothing to load")
    return out


def weights_fingerprint(named_tensors: Sequence[tuple[str, torch.Tensor]]) -> dict[str, Any]:
    """Tensor count, total element count and the float64 sum of every value."""
    total = 0.0
    for _, tensor in named_tensors:
        total += float(tensor.detach().sum(dtype=torch.float64).item())
    return {
        "tensors": len(named_tensors),
        "numel": int(sum(t.numel() for _, t in named_tensors)),
        "sum": total,
    }


def weight_ack(version: int, fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """What a worker answers after loading: plain values only (they cross a process)."""
    return {"version": int(version), **{k: fingerprint[k] for k in ("tensors", "numel", "sum")}}


def check_acks(acks: Any, version: int, sent: Mapping[str, Any]) -> None:
    """Raise RuntimeError unless every worker acknowledged `version` and the tensors `sent`."""
    if not isinstance(acks, Sequence) or not acks:
        raise RuntimeError(f"vLLM weight update returned no worker acknowledgement: {acks!r}")
    for rank, ack in enumerate(acks):
        if not isinstance(ack, Mapping):
            raise RuntimeError(f"vLLM worker {rank} answered {ack!r}, not a weight ack")
        if ack.get("version") != int(version):
            raise RuntimeError(
                f"vLLM worker {rank} reports weight version {ack.get('version')}, expected "
                f"{version}: the weights were not applied"
            )
        same = ack.get("tensors") == sent["tensors"] and ack.get("numel") == sent["numel"]
        if not same or not _close(ack.get("sum"), sent["sum"]):
            raise RuntimeError(
                f"vLLM worker {rank} received different weights than were sent "
                f"(worker {dict(ack)}, sent {dict(sent)})"
            )


def same_weights(ack: Any, version: int, fingerprint: Any) -> bool:
    """True when `ack` (of an earlier load) acknowledged `version` and the tensors that
    `fingerprint` describes: a push of those weights again can be answered without reloading
    (several learner ranks push identical weights to one shared fleet)."""
    if not isinstance(ack, Mapping) or not isinstance(fingerprint, Mapping):
        return False
    try:
        check_acks([ack], version, fingerprint)
    except (RuntimeError, KeyError):
        return False
    return True


def _close(a: Any, b: float) -> bool:
    """Float64 sums of the same values, possibly reduced in another order or device."""
    if not isinstance(a, int | float):
        return False
    return math.isclose(float(a), b, rel_tol=1e-6, abs_tol=1e-6)


class ReceiveTap:
    """Shadows `model.load_weights` (an instance attribute) to fingerprint every tensor that
    vLLM's weight-transfer engine loads, then forwards the call unchanged."""

    def __init__(self, model: Any) -> None:
        self.model, self.tensors, self.numel, self.sum = model, 0, 0, 0.0
        self.original = model.load_weights
        model.load_weights = self._load

    def _load(self, weights: Any, *args: Any, **kwargs: Any) -> Any:
        batch = as_named_tensors(list(weights))
        seen = weights_fingerprint(batch)
        self.tensors += seen["tensors"]
        self.numel += seen["numel"]
        self.sum += seen["sum"]
        return self.original(batch, *args, **kwargs)

    def close(self) -> dict[str, Any]:
        """Restore `load_weights`; the fingerprint of everything loaded through the tap."""
        if self.model.__dict__.get("load_weights") == self._load:
            del self.model.__dict__["load_weights"]
        return {"tensors": self.tensors, "numel": self.numel, "sum": self.sum}


class Fingerprint:
    """A running `weights_fingerprint` of the tensors that pass through `stream`."""

    def __init__(self) -> None:
        self.tensors, self.numel, self.sum = 0, 0, 0.0

    def stream(self, named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, Any]]:
        for name, tensor in named:
            self.tensors += 1
            self.numel += int(tensor.numel())
            self.sum += float(tensor.detach().sum(dtype=torch.float64).item())
            yield name, tensor

    def as_dict(self) -> dict[str, Any]:
        return {"tensors": self.tensors, "numel": self.numel, "sum": self.sum}


def snapshot_tensors(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of a safetensors file, one at a time, sorted by name (FileNotFoundError
    naming the path at once if it is absent)."""
    from safetensors import safe_open

    if not Path(path).is_file():
        raise FileNotFoundError(f"weight snapshot {path} does not exist")

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        with safe_open(str(path), framework="pt") as f:
            for name in sorted(f.keys()):
                yield name, f.get_tensor(name)

    return tensors()


class WeightUpdateExtension:
    """Mixed into vLLM's worker class by `worker_extension_cls`; `self` is the vLLM worker,
    whose `reload_weights(weights_iterator=..., is_checkpoint_format=True)` loads HF-named
    checkpoint tensors and runs vLLM's post-load processing."""

    def frlab_load_snapshot(
        self, path: str, version: int, fingerprint: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Stream the safetensors snapshot at `path` into the served model through the
        worker's reload path and acknowledge `version`; if this worker already holds
        `version` with that `fingerprint` (another learner rank pushed the same weights),
        answer the same acknowledgement without reloading. A path outside the folder
        `FRLAB_SNAPSHOT_ROOT` names (when set) is refused, the weights unchanged."""
        held = getattr(self, "frlab_ack", None)
        if getattr(self, "frlab_version", None) == int(version) and same_weights(
            held, version, fingerprint
        ):
            return dict(held)
        reload = getattr(self, "reload_weights", None)
        if not callable(reload):
            raise RuntimeError(
                "this vLLM worker has no reload_weights(weights_iterator=..., "
                f"is_checkpoint_format=...): frlab needs {SUPPORTED}"
            )
        tensors = snapshot_tensors(check_snapshot_path(path, os.environ.get(SNAPSHOT_ROOT_VAR)))
        self.frlab_version, self.frlab_ack = None, None  # the weights are about to change
        seen = Fingerprint()
        reload(weights_iterator=seen.stream(tensors), is_checkpoint_format=True)
        self.frlab_version = int(version)
        self.frlab_ack = weight_ack(version, seen.as_dict())
        return dict(self.frlab_ack)

    def frlab_nccl_join(self, token: str) -> dict[str, str]:
        """Remember the token of the NCCL group this worker has just joined."""
        self.frlab_group = str(token)
        return {"group": self.frlab_group}

    def frlab_nccl_begin(self, token: str) -> dict[str, bool]:
        """Before a broadcast: not ready (and no change) unless this worker joined group
        `token`; else forget the held version and fingerprint what vLLM loads from now on."""
        if getattr(self, "frlab_group", None) != str(token):
            return {"ready": False}
        self._frlab_close_tap()
        engine = getattr(self, "weight_transfer_engine", None)
        model = getattr(engine, "model", None) or self.get_model()  # type: ignore[attr-defined]
        self.frlab_tap = ReceiveTap(model)
        self.frlab_version, self.frlab_ack = None, None
        return {"ready": True}

    def frlab_commit_version(self, version: int, fingerprint: Mapping[str, Any]) -> dict[str, Any]:
        """After a broadcast: commit `version` only if the tensors loaded since
        `frlab_nccl_begin` match `fingerprint`; answer the ack of what was loaded either way
        (the sender's `check_acks` names a mismatch)."""
        received = self._frlab_close_tap()
        if received is None:
            raise RuntimeError("frlab_commit_version without frlab_nccl_begin: nothing received")
        ack = weight_ack(version, received)
        if same_weights(ack, version, fingerprint):
            self.frlab_version, self.frlab_ack = int(version), ack
        return dict(ack)

    def _frlab_close_tap(self) -> dict[str, Any] | None:
        tap = getattr(self, "frlab_tap", None)
        self.frlab_tap = None
        return None if tap is None else tap.close()

    def frlab_weight_version(self) -> dict[str, int | None]:
        """The version this worker holds (None before the first load, or after a failed one)."""
        return {"version": getattr(self, "frlab_version", None)}
