"""LoRA on the `vllm` engine: vLLM serves the frozen base and the learner's adapter with its own
LoRA support, and a weight push sends the adapter only. Never imports vllm (the engine passes
its module in).

The engine starts with `enable_lora` and a `max_lora_rank` that holds the adapter's rank (the
smallest rank vLLM accepts that is >= it), one adapter slot. Every request carries one
`LoRARequest` (id 1). A push writes the adapter as a peft folder (`adapter_model.safetensors`
under peft's saved names, `adapter_config.json`), atomically, one folder per version, and loads
it with `add_lora(..., load_inplace=True)`: vLLM replaces the adapter of id 1 in place, so the
next step of every request runs base + new adapter (without `load_inplace` vLLM keeps an
adapter id it already holds and the push would silently not land). The update modes
(in_flight, resubmit, drain) and the version labels are the engine's, unchanged.

vLLM adapts linear modules. An adapter of MoE expert parameters (peft `target_parameters`,
frlab's `all-linear` on Qwen3-MoE) is refused by name: serve it with a torch engine.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from frlab.model.lora import ADAPTER_MARKERS, is_adapter
from frlab.rollout.engine import EngineError

ADAPTER_ID = 1  # vLLM's id of the one adapter this engine serves (ids start at 1)
ADAPTER_NAME = "frlab-policy"
KNOWN_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM 0.28-0.33's MaxLoRARanks
ADAPTER_FILE, CONFIG_FILE = "adapter_model.safetensors", "adapter_config.json"


def adapter_config(policy: Any) -> dict[str, Any] | None:
    """The peft config of a LoRA policy as the JSON of a saved adapter (None: no adapter);
    EngineError naming `model.lora.target_modules` for an adapter vLLM cannot serve."""
    configs = getattr(policy, "peft_config", None)
    if not configs:
        return None
    name, config = next(iter(configs.items()))
    data = json.loads(json.dumps(config.to_dict(), default=_jsonable))
    if data.get("target_parameters"):
        raise EngineError(
            f"vLLM serves LoRA on linear modules, and this adapter adapts parameters "
            f"{data['target_parameters'][:3]} (MoE experts): set model.lora.target_modules to "
            "linear module names, or serve it with rollout/engine=torch"
        )
    data["frlab_adapter_name"] = name
    return data


def _jsonable(value: Any) -> Any:
    if isinstance(value, set | frozenset | tuple):
        return sorted(value) if all(isinstance(v, str) for v in value) else list(value)
    return str(value)


def lora_engine_options(
    config: Mapping[str, Any], options: Mapping[str, Any], ranks: tuple[int, ...] | None
) -> dict[str, Any]:
    """`options` with vLLM's LoRA switched on for an adapter of `config` (the user's own
    `max_lora_rank` / `max_loras` kept); `ranks`: the ranks the installed vLLM accepts."""
    rank = int(config["r"])
    allowed = sorted(ranks or KNOWN_RANKS)
    fitting = [r for r in allowed if r >= rank]
    if not fitting:
        raise EngineError(f"model.lora.rank {rank} is above vLLM's largest LoRA rank {allowed[-1]}")
    out = dict(options)
    out["enable_lora"] = True
    out.setdefault("max_lora_rank", fitting[0])
    out.setdefault("max_loras", 1)
    return out


def saved_name(name: str, adapter: str) -> str:
    """peft's saved name of an adapter tensor: the adapter's own name taken out."""
    for marker in ADAPTER_MARKERS:
        name = name.replace(f".{marker}.{adapter}.", f".{marker}.")
    return name


def write_adapter(
    state_dict: Mapping[str, torch.Tensor],
    config: Mapping[str, Any],
    folder: str | os.PathLike[str],
    version: int,
) -> Path:
    """Write the adapter of `version` as a peft folder under `folder`, atomically; its path."""
    bad = [n for n in state_dict if not is_adapter(n)]
    if bad:
        raise EngineError(f"a LoRA engine loads adapter tensors only, got {bad[:3]}")
    adapter = str(config.get("frlab_adapter_name", "default"))
    tensors = {
        saved_name(k, adapter): v.detach().to("cpu").contiguous() for k, v in state_dict.items()
    }
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    final, tmp = root / f"adapter-v{int(version)}", root / f".tmp-adapter-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        save_file(tensors, str(tmp / ADAPTER_FILE), metadata={"frlab_version": str(version)})
        peft = {k: v for k, v in config.items() if not k.startswith("frlab_")}
        (tmp / CONFIG_FILE).write_text(json.dumps(peft, indent=1))
        if final.exists():  # the same version again (a resumed run): replace it
            shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def prune_adapters(folder: str | os.PathLike[str], keep: int = 2) -> None:
    """Delete all but the `keep` newest adapter folders."""
    root = Path(folder)
    found = sorted(
        (int(p.name.removeprefix("adapter-v")), p)
        for p in root.glob("adapter-v*")
        if p.name.removeprefix("adapter-v").isdigit()
    )
    for _, path in found[: max(0, len(found) - keep)]:
        shutil.rmtree(path, ignore_errors=True)


def adapter_request(vllm: Any, path: str | os.PathLike[str], *, load_inplace: bool) -> Any:
    """vLLM's `LoRARequest` (from the engine's `vllm` namespace) for its one adapter."""
    return vllm.LoRARequest(ADAPTER_NAME, ADAPTER_ID, str(path), load_inplace=load_inplace)
