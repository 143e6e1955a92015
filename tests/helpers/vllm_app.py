"""vLLM's own OpenAI-compatible server application (build_app + init_app_state, exactly what
`vllm serve` runs, vllm/entrypoints/launchers/) over a stand-in engine client, served by
uvicorn on loopback in a thread. The engine client implements vLLM's `EngineClient` ABC
(vllm/engine/protocol.py): `generate` yields vLLM `RequestOutput`s of a scripted sampler,
`collective_rpc` runs frlab's worker extension on two fake workers, `pause_generation` /
`resume_generation` are recorded (with `abort_after` set, requests end aborted after that
many tokens, as vLLM's output processor ends them), `update_weight_version` sets the label
that each output's `weight_versions` spans carry (vLLM 0.32+; `relabel_after` splits them
as an update between two steps does), the rest answers as an idle healthy engine.
Everything between HTTP and the engine client is vLLM's code."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator
from typing import Any

from helpers.ports import free_port as free_port  # re-exported
from helpers.vllm_worker import FakeWorker

EXTENSION = "frlab.rollout.vllm.worker_extension.WeightUpdateExtension"
SERVE_FLAGS = [
    "--worker-extension-cls",
    EXTENSION,
    "--logprobs-mode",
    "processed_logprobs",
    "--generation-config",
    "vllm",
    "--max-model-len",
    "128",
    "--skip-tokenizer-init",
    "--enforce-eager",
]


def make_client(vllm_config: Any) -> Any:
    """An instance of a subclass of vLLM's EngineClient (defined here: vllm imports lazily)."""
    from vllm.engine.protocol import EngineClient
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.renderers import renderer_from_config

    class ScriptedEngineClient(EngineClient):
        """Samples token `(last + 1 + i) % vocab` with log-prob `-0.5 - i / 100`."""

        def __init__(self) -> None:
            self.vllm_config = vllm_config
            self.model_config = vllm_config.model_config
            self.renderer = renderer_from_config(vllm_config)
            self.input_processor = None
            self.workers = [FakeWorker(), FakeWorker()]
            self.sampling: list[Any] = []
            self.rpcs: list[str] = []
            self.abort_after: int | None = None  # end requests aborted after this many tokens
            self.pauses: list[str] = []  # the mode of each pause_generation, "resume" after
            self.clear_cache: list[bool] = []  # the clear_cache of each pause_generation
            self.weight_version = "default"  # vLLM's EngineCore label before any update
            self.relabel_after: int | None = None  # tokens after this many: label "<v>+1"
            self.loras: list[tuple[str, str, bool]] = []  # (name, path, in place) per add_lora
            self.named_loras: list[str | None] = []  # the adapter each generate call got

        is_running = property(lambda self: True)
        is_stopped = property(lambda self: False)
        errored = property(lambda self: False)
        dead_error = property(lambda self: RuntimeError("dead"))

        async def generate(
            self, prompt: Any, sampling_params: Any, request_id: str, *args: Any, **kwargs: Any
        ) -> AsyncGenerator[Any, None]:
            ids = list(prompt["prompt_token_ids"])
            self.sampling.append(sampling_params)
            self.named_loras.append(getattr(kwargs.get("lora_request"), "lora_name", None))
            vocab = self.model_config.get_vocab_size()
            n, reason = sampling_params.max_tokens, "length"
            if self.abort_after is not None:  # what vLLM's output processor gives an abort
                n, reason = min(n, self.abort_after), "abort"
            tokens = [(ids[-1] + 1 + i) % vocab for i in range(n)]
            logprobs = [{t: Logprob(logprob=-0.5 - i / 100, rank=1)} for i, t in enumerate(tokens)]
            out = CompletionOutput(
                index=0,
                text="",
                token_ids=tokens,
                cumulative_logprob=sum(-0.5 - i / 100 for i in range(len(tokens))),
                logprobs=logprobs,
                finish_reason=reason,
                **self.spans(len(tokens)),
            )
            await asyncio.sleep(0)
            yield RequestOutput(request_id, None, ids, None, [out], finished=True)

        def spans(self, n: int) -> dict[str, Any]:
            """vLLM 0.32+'s `weight_versions` spans (the label, or two labels with
            `relabel_after`: an update between two steps); {} where the release has none."""
            from dataclasses import fields

            if "weight_versions" not in {f.name for f in fields(CompletionOutput)}:
                return {}
            from vllm.outputs import WeightVersionSpan

            cut = n if self.relabel_after is None else min(self.relabel_after, n)
            spans = [WeightVersionSpan(self.weight_version, 0, cut)] if cut else []
            if cut < n:
                spans.append(WeightVersionSpan(str(int(self.weight_version) + 1), cut, n))
            return {"weight_versions": spans}

        async def update_weight_version(self, new_version: str) -> None:
            self.weight_version = new_version

        async def get_weight_version(self) -> str:
            return self.weight_version

        async def collective_rpc(
            self,
            method: str,
            timeout: float | None = None,
            args: tuple = (),
            kwargs: dict | None = None,
        ) -> list[Any]:
            self.rpcs.append(method)
            return [getattr(w, method)(*args, **(kwargs or {})) for w in self.workers]

        def encode(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        async def abort(self, request_id: Any, internal: bool = False) -> None: ...

        async def notify_kv_transfer_request_rejected(self, *args: Any, **kwargs: Any) -> None: ...

        async def is_tracing_enabled(self) -> bool:
            return False

        async def do_log_stats(self) -> None: ...

        async def check_health(self) -> None: ...

        async def start_profile(self) -> None: ...

        async def stop_profile(self) -> None: ...

        async def reset_mm_cache(self) -> None: ...

        async def reset_encoder_cache(self) -> None: ...

        async def reset_prefix_cache(
            self, reset_running_requests: bool = False, reset_connector: bool = False
        ) -> bool:
            return True

        async def sleep(self, level: int = 1, mode: Any = "abort") -> None: ...

        async def wake_up(self, tags: Any = None) -> None: ...

        async def is_sleeping(self) -> bool:
            return False

        async def add_lora(self, lora_request: Any) -> bool:
            self.loras.append(
                (lora_request.lora_name, lora_request.lora_path, bool(lora_request.load_inplace))
            )
            return True

        async def pause_generation(self, *args: Any, mode: str = "abort", **kwargs: Any) -> None:
            self.pauses.append(mode)
            self.clear_cache.append(kwargs.get("clear_cache", True))

        async def resume_generation(self) -> None:
            self.pauses.append("resume")

        async def is_paused(self) -> bool:
            return False

        def shutdown(self, timeout: float | None = None) -> None: ...

        async def get_supported_tasks(self) -> tuple[str, ...]:
            return ("generate",)

    return complete(ScriptedEngineClient)()


def complete(cls: type) -> type:
    """`cls` with every abstract method the installed vLLM's EngineClient declares beyond
    the ones above (a release adds some: `release_kv_cache_memory` in 0.31) as a method that
    raises when called: the app may hold them, frlab's requests never reach them."""
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if not missing:
        return cls

    def unused(name: str) -> Any:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError(f"the contract tests' engine client has no {name}")

        return method

    return type(cls.__name__, (cls,), {name: unused(name) for name in missing})


class VllmAppServer:
    """vLLM's app for `model_dir` with `SERVE_FLAGS` (and `flags`), on 127.0.0.1:`port` in a
    thread."""

    def __init__(self, model_dir: str, *flags: str) -> None:
        from test_cli_contract import serve_parser  # vLLM's own `vllm serve` parser

        self.args = serve_parser().parse_args(["serve", model_dir, *SERVE_FLAGS, *flags])
        self.args.model = self.args.model_tag
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.client: Any = None
        self.app: Any = None
        self._server: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported by start()
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        import uvicorn
        from vllm.engine.arg_utils import AsyncEngineArgs

        try:  # vllm 0.29
            from vllm.entrypoints.launchers.api_server.app_state import init_app_state
            from vllm.entrypoints.launchers.app import build_app
        except ImportError:  # vllm 0.28
            from vllm.entrypoints.openai.api_server import build_app, init_app_state

        config = AsyncEngineArgs.from_cli_args(self.args).create_engine_config()
        self.client = make_client(config)
        app = build_app(self.args, ("generate",), config.model_config)
        self.app = app  # its routes and middleware, as vLLM built them
        await init_app_state(self.client, app.state, self.args, ("generate",))
        self._server = uvicorn.Server(
            uvicorn.Config(
                app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"
            )
        )
        self._ready.set()
        await self._server.serve()

    def start(self, timeout: float = 300.0) -> None:
        import httpx

        self._thread.start()
        self._ready.wait(timeout)
        deadline = time.monotonic() + timeout
        while self._error is None:
            try:
                if httpx.get(self.url + "/health", timeout=2.0, trust_env=False).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("vLLM's app did not answer /health")
            time.sleep(0.1)
        raise RuntimeError(f"vLLM's app failed to start: {self._error!r}") from self._error

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        self._thread.join(30)
