"""A vLLM-like server with runtime LoRA loading, as `vllm serve --enable-lora` with
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=1` answers it (read from vLLM 0.32's
`vllm/entrypoints/serve/lora/api_router.py` and `vllm/entrypoints/openai/models/serving.py`;
the `vllm_contract` tier plays the same script against vLLM's own app, test_lora_contract.py):

- `POST /v1/load_lora_adapter {lora_name, lora_path}`: 200 with a plain-text body; 400 for a
  missing field, the base model's name, or a name already loaded (without `load_inplace`);
  404 when the folder holds no adapter. The adapter's version (its file's `frlab_version`) is
  what samples the requests that name it (`PausingVllmServer.truth` per token);
- `POST /v1/unload_lora_adapter {lora_name}`: 200 plain text; 404 for an unknown name;
- `GET /v1/models`: the base, then one card per adapter (`root` its folder, `parent` the base);
- a completion naming an unknown model: 404;
- `lora_routes=False`: a server started without runtime LoRA updating (404 on both routes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from safetensors import safe_open

from frlab.rollout.remote import protocol as proto
from helpers.nccl import Refused
from helpers.pausing_vllm import PausingVllmServer

BASE = "fake"
LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"


def error(status: int, message: str) -> Refused:
    """vLLM's ErrorResponse shape."""
    return Refused(status, {"error": {"message": message, "code": status}})


class LoraVllmServer(PausingVllmServer):
    """PausingVllmServer that serves LoRA adapters loaded at run time (see the module docstring)."""

    def __init__(self, step_s: float = 0.02, **kw: Any) -> None:
        super().__init__(step_s=step_s, **kw)
        self.adapters: dict[str, tuple[str, int]] = {}  # name -> (folder, version)
        self.lora_routes = True
        self.loads: list[tuple[str, str]] = []  # (name, folder) of every successful load
        self.named: list[str | None] = []  # the model each completion named

    def restart(self) -> None:
        super().restart()
        self.adapters = {}

    def get(self, path: str) -> Any:
        if path == proto.MODELS:
            cards = [{"id": BASE, "object": "model", "root": BASE, "parent": None}]
            cards += [
                {"id": n, "object": "model", "root": folder, "parent": BASE}
                for n, (folder, _) in self.adapters.items()
            ]
            return {"object": "list", "data": cards}
        return super().get(path)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        if path in (LOAD, UNLOAD):
            if not self.lora_routes:
                raise Refused(404, {"detail": "Not Found"})
            return self.load(body) if path == LOAD else self.unload(body)
        if path.split("?", 1)[0] == proto.COMPLETIONS:
            model = body.get("model")
            self.named.append(model)
            if model != BASE and model not in self.adapters:
                raise error(404, f"The model `{model}` does not exist.")
        return super().post(path, body)

    def load(self, body: dict[str, Any]) -> bytes:
        name, folder = body.get("lora_name"), body.get("lora_path")
        if not name or not folder:
            raise error(400, "Both 'lora_name' and 'lora_path' must be provided.")
        if name == BASE:
            raise error(400, f"The lora adapter '{name}' conflicts with a served base model.")
        if name in self.adapters and not body.get("load_inplace"):
            raise error(400, f"The lora adapter '{name}' has already been loaded.")
        try:
            with safe_open(str(Path(folder) / "adapter_model.safetensors"), framework="pt") as f:
                version = int(f.metadata()["frlab_version"])
        except OSError:
            raise error(404, f"Loading lora {name} failed: No adapter found for {folder}") from None
        self.adapters[name] = (str(folder), version)
        self.loads.append((name, str(folder)))
        return f"Success: LoRA adapter '{name}' added successfully.".encode()

    def unload(self, body: dict[str, Any]) -> bytes:
        name = body.get("lora_name")
        if name not in self.adapters:
            raise error(404, f"The lora adapter '{name}' cannot be found.")
        del self.adapters[name]
        return f"Success: LoRA adapter '{name}' removed successfully.".encode()

    def version_now(self, model: str | None = None) -> int:
        if model in self.adapters:
            return self.adapters[model][1]
        return super().version_now(model)
