"""Helpers of the `vllm_contract` tier: a tiny model folder, the real `VllmConfig` built from
it by vLLM's own `AsyncEngineArgs` (CPU platform), and a FastAPI app carrying vLLM's own
routers over a stand-in engine client. Imported only where vllm is installed."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

from helpers.tiny import tiny_qwen2_config

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
TINY = tiny_qwen2_config()


def tiny_model(path: Path) -> Path:
    """A random-init Qwen2 folder (config, weights, a generation config with a penalty)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(**TINY)).save_pretrained(path)
    defaults = {
        "do_sample": True,
        "repetition_penalty": 1.3,
        "temperature": 0.6,
        "top_p": 0.9,
        "top_k": 20,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.4,
    }
    GenerationConfig(**defaults).save_pretrained(path)
    return path


@functools.cache
def vllm_config(model_dir: str, **overrides: Any) -> Any:
    """vLLM's own config for `model_dir`, built as `vllm serve` builds it (CPU platform)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    kwargs = {
        "model": model_dir,
        "skip_tokenizer_init": True,
        "max_model_len": 128,
        "enforce_eager": True,
        **overrides,
    }
    return AsyncEngineArgs(**kwargs).create_engine_config()


# Where a release keeps a router: the weight-transfer routes moved from serve/dev/rlhf to
# rl/online in vLLM 0.32 (their HTTP paths did not change).
ROUTER_HOMES = {
    "dev.rlhf": (
        "vllm.entrypoints.serve.dev.rlhf.api_router",
        "vllm.entrypoints.rl.online.api_router",
    )
}


def router_module(name: str) -> str:
    """The module of router `name` in the installed vLLM."""
    for module in ROUTER_HOMES.get(name, (f"vllm.entrypoints.serve.{name}.api_router",)):
        if importlib.util.find_spec(module.rsplit(".", 1)[0]) is not None:
            return module
    raise ImportError(
        f"the installed vLLM has no router {name!r} (looked in {ROUTER_HOMES.get(name)})"
    )


def router_app(client: Any, *routers: str, vllm_config: Any = None) -> Any:
    """A FastAPI app with vLLM's own routers (`dev.rpc`, `dev.cache`, `dev.rlhf`,
    `dev.server_info`, `health`) over the engine client `client`."""
    import importlib

    from fastapi import FastAPI

    app = FastAPI()
    for name in routers:
        if name == "health":
            from vllm.entrypoints.serve.instrumentator.health import router

            app.include_router(router)
        else:  # attach_router(app) up to 0.31; a module-level `router` in rl/online (0.32+)
            module = importlib.import_module(router_module(name))
            if hasattr(module, "attach_router"):
                module.attach_router(app)
            else:
                app.include_router(module.router)
    app.state.engine_client = client
    app.state.vllm_config = vllm_config
    return app
