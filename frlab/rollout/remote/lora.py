"""LoRA on a `vllm serve` fleet (held by `frlab.rollout.remote.engine.RemoteEngine`): the
servers serve the frozen base model, each update sends the adapter only, and vLLM loads it with
its own runtime LoRA loading.

The servers run with `--enable-lora --max-lora-rank R` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`
(the launch recipe adds them when `LORA_RANK=R` is set), on the same base model as the learner
(`model.name`). Version v's adapter is written once as a peft folder
(`<snapshot_dir>/adapter-v<v>/`, atomically, frlab.rollout.vllm.lora.write_adapter) and
loaded on each server under its own name `frlab-v<v>` (`POST /v1/load_lora_adapter`, not in
place): vLLM gives a new name a new adapter id, so it reads the new folder, and its prefix cache
(keyed by the adapter's name) never serves KV of an older adapter. The version is proved by
`GET /v1/models`: the name must be listed with that folder as its root, or (several learner
ranks share the fleet) a folder holding the same version and the same tensors. Every request
names the adapter of the version its server proved, so its tokens carry that version exactly;
older `frlab-v*` names are unloaded afterwards.

`weight_update` drain and resubmit work as with full weights; in_flight is refused: a running
request keeps the adapter it named, and switching it would need an in-place load, which vLLM
0.28-0.32 then repeat from disk at every step. frlab.serve servers are refused (they load full
weights only), as is NCCL weight sync (an adapter travels as files).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import torch
from safetensors import safe_open

from frlab.errors import ConfigError
from frlab.rollout.engine import EngineError
from frlab.rollout.remote import protocol as proto
from frlab.rollout.remote.fleet import Fleet, Server, ServerFault, Snapshot
from frlab.rollout.vllm.lora import ADAPTER_FILE, prune_adapters, write_adapter
from frlab.rollout.vllm.worker_extension import weights_fingerprint

LOAD_ADAPTER, UNLOAD_ADAPTER = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
PREFIX = "frlab-v"
LORA_WEIGHT_UPDATES = ("drain", "resubmit")
_RANK = re.compile(r"rank\d+")  # a learner rank's snapshot folder (frlab.rollout.remote.engine)
NO_LORA_ROUTE = (
    "it does not load LoRA adapters at run time ({error}): start it with --enable-lora "
    "--max-lora-rank R and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 (the launch recipe: LORA_RANK=R)"
)


def adapter_name(version: int) -> str:
    """The name version `version`'s adapter is served under."""
    return f"{PREFIX}{int(version)}"


def check_lora_settings(
    lora: Mapping[str, Any] | None, weight_update: str | None, weight_sync: str
) -> None:
    """ConfigError naming the key a LoRA fleet cannot honour."""
    if lora is None:
        return
    if weight_update not in LORA_WEIGHT_UPDATES:
        raise ConfigError(
            "rollout.weight_update",
            f"rollout.weight_update={weight_update} with model.lora on a server fleet: a running "
            "request keeps the adapter it named, so use drain or resubmit",
        )
    if weight_sync != "filesystem":
        raise ConfigError(
            "rollout.remote.weight_sync",
            "must be filesystem with model.lora: an adapter travels "
            "to the servers as a peft folder",
        )


def adapter_identity(folder: str | os.PathLike[str]) -> tuple[int, dict[str, Any]] | None:
    """(version, fingerprint) of the adapter folder `folder`; None if it cannot be read."""
    try:
        with safe_open(str(Path(folder) / ADAPTER_FILE), framework="pt") as f:
            version = int((f.metadata() or {})["frlab_version"])
            tensors = [(k, f.get_tensor(k)) for k in f.keys()]  # noqa: SIM118
    except (OSError, KeyError, ValueError, RuntimeError):
        return None
    return version, weights_fingerprint(tensors)


def listed_adapters(body: Any) -> dict[str, str]:
    """`{name: root}` of the adapters a `/v1/models` answer lists (the base has no parent)."""
    try:
        cards = body["data"]
        return {str(c["id"]): str(c.get("root")) for c in cards if c.get("parent")}
    except (KeyError, TypeError, AttributeError) as exc:
        raise proto.MalformedResponse(
            f"/v1/models answer is not a model list: {body!r:.200}"
        ) from exc


class LoraAdapters:
    """A LoRA fleet's adapter snapshots, and their load and proof on each server (see the
    module docstring). Owned by the engine; its requests go through the engine's `fleet`."""

    def __init__(
        self,
        config: Mapping[str, Any],
        snapshot_dir: Path,
        keep_snapshots: int,
        fleet: Fleet,
    ) -> None:
        self.config, self.snapshot_dir = config, snapshot_dir  # the engine's own peft config
        self.keep_snapshots, self.fleet = int(keep_snapshots), fleet

    def write(self, state_dict: Mapping[str, torch.Tensor], version: int) -> Snapshot:
        """The adapter of `version` as a peft folder, and its identity read back from disk."""
        folder = write_adapter(state_dict, self.config, self.snapshot_dir, version)
        identity = adapter_identity(folder)
        if identity is None:
            raise EngineError(f"the adapter folder {folder} just written cannot be read back")
        return Snapshot(folder, version, identity[1])

    def prune(self) -> None:
        """Remove adapter folders beyond the newest `keep_snapshots`."""
        prune_adapters(self.snapshot_dir, keep=self.keep_snapshots)

    async def load(self, server: Server, snap: Snapshot) -> int:
        """Load `snap` on `server` under its version's name unless it already serves it, prove
        it by `/v1/models`, unload older names; the version proved."""
        name = adapter_name(snap.version)
        root = listed_adapters(await self.fleet.get(server, proto.MODELS)).get(name)
        if root is not None and not self._served_copy(root, snap):  # reload it from our folder
            await self._lora_call(server, UNLOAD_ADAPTER, {"lora_name": name})
            root = None
        if root is None:
            await self._lora_call(
                server, LOAD_ADAPTER, {"lora_name": name, "lora_path": str(snap.path)}
            )
        listed = listed_adapters(await self.fleet.get(server, proto.MODELS))
        served = listed.get(name)
        if served is None or not (Path(served) == Path(snap.path) or _holds(served, snap)):
            raise RuntimeError(f"/v1/models lists {listed}, not {name} at {snap.path}")
        server.adapter = name
        old = [n for n in listed if n.startswith(PREFIX) and n != name]
        await asyncio.gather(
            *(self._lora_call(server, UNLOAD_ADAPTER, {"lora_name": n}, quiet=True) for n in old)
        )
        return snap.version

    def _served_copy(self, root: str, snap: Snapshot) -> bool:
        """Whether the adapter a server lists from folder `root` under `snap`'s name can stay:
        another learner rank's copy of the same push (same version and tensors). Our own
        folder is reloaded (it may have been rewritten), an earlier run's replaced; another
        rank's folder of this run with other tensors means the replicas diverged (raised)."""
        there, mine = Path(root), Path(snap.path)
        if there == mine:
            return False
        if _holds(there, snap):
            return True
        sibling = _RANK.fullmatch(there.parent.name) and _RANK.fullmatch(mine.parent.name)
        if sibling and there.parent.parent == mine.parent.parent:
            raise RuntimeError(
                f"another learner rank pushed other tensors as version {snap.version} "
                f"({there}): the replicas diverged"
            )
        return False

    async def _lora_call(
        self, server: Server, path: str, body: dict[str, Any], quiet: bool = False
    ) -> None:
        """POST a LoRA route (vLLM answers 200 with a plain-text body): 5xx and transport errors
        raise ServerFault, a 4xx EngineError (naming the launch flags when the route is absent);
        `quiet`: a failure is ignored (unloading an old name)."""
        try:
            resp = await self.fleet.send(
                "POST", server.url + path, json=body, timeout=self.fleet.request_timeout_s
            )
        except httpx.HTTPError as exc:
            if quiet:
                return
            raise ServerFault("dead", f"{path}: {exc!r}") from exc
        if resp.status_code < 400 or quiet:
            return
        if resp.status_code >= 500:
            raise ServerFault("dead", f"{path} answered HTTP {resp.status_code}: {resp.text[:200]}")
        if resp.status_code in (404, 405):
            raise EngineError(NO_LORA_ROUTE.format(error=f"{path}: HTTP {resp.status_code}"))
        raise EngineError(f"{path} refused (HTTP {resp.status_code}): {resp.text[:300]}")


def _holds(folder: str | os.PathLike[str], snap: Snapshot) -> bool:
    """Whether the adapter folder `folder` holds `snap`'s version and tensors (our own folder
    was identified when it was written: `LoraAdapters.write`)."""
    return adapter_identity(folder) == (snap.version, dict(snap.fingerprint))
