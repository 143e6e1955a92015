"""`vllm` engine: vLLM's asynchronous engine in-process, behind the frlab `Engine` interface.

GPU only (extra `vllm`); `vllm` is imported inside `VLLMEngine.start`, never at module import,
so `import frlab.rollout` stays light. The adapter is thin on purpose: the logic that can be
checked without a GPU lives in pure functions tested on CPU with fake vLLM objects
(`vllm_sampling_kwargs`, `vllm_engine_kwargs`, `sampled_log_probs`, `generation_result`).

Behaviour log-probs (SPEC §3) come from vLLM itself: `logprobs=1` returns the sampled token's
log-prob, and the engine runs with `logprobs_mode="processed_logprobs"` (vLLM >= 0.10.2) so
it is the log-prob after temperature / top-k / top-p, i.e. of the distribution sampled from.
vLLM runs on its own event loop in a background thread; `generate` bridges to it from the
caller's loop, `update_weights` loads new weights through `collective_rpc` between engine
steps. Tokens are tagged with the weight version seen when vLLM streamed them back; a chunk
that straddles an update gets the older version (a conservative lag).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import torch

from frlab.rollout.engine import Engine, EngineError, GenerationResult, SamplingParams


def vllm_sampling_kwargs(params: SamplingParams, *, seed: int | None = None) -> dict[str, Any]:
    """Keyword arguments for `vllm.SamplingParams` that reproduce frlab's sampling contract:
    stop only on `stop_token_ids` (eos ignored, as in the torch engine), one sampled-token
    log-prob per step, no detokenisation (token in, token out)."""
    params.validate(off_policy_correction=False)
    kwargs: dict[str, Any] = {
        "n": 1,
        "temperature": float(params.temperature),
        "top_p": float(params.top_p),
        "top_k": int(params.top_k) if params.top_k > 0 else -1,
        "max_tokens": int(params.max_new_tokens),
        "stop_token_ids": [int(t) for t in params.stop_token_ids],
        "ignore_eos": True,
        "logprobs": 1,
        "detokenize": False,
        "skip_special_tokens": False,
    }
    if seed is not None:
        kwargs["seed"] = int(seed)
    return kwargs


def vllm_engine_kwargs(model: str, supported: Iterable[str], **options: Any) -> dict[str, Any]:
    """`AsyncEngineArgs` keywords: `model`, `options`, and processed log-probs where the
    installed vLLM supports `logprobs_mode` (`supported`: its field names). Unknown option
    names raise ValueError naming them."""
    names = set(supported)
    kwargs: dict[str, Any] = {"model": model, **options}
    unknown = sorted(k for k in kwargs if k not in names)
    if unknown:
        raise ValueError(f"vLLM AsyncEngineArgs has no field(s): {', '.join(unknown)}")
    if "logprobs_mode" in names:
        kwargs.setdefault("logprobs_mode", "processed_logprobs")
    return kwargs


def _logprob_value(entry: Any) -> float:
    """A vLLM `Logprob` object (`.logprob`) or a bare float."""
    return float(getattr(entry, "logprob", entry))


def sampled_log_probs(token_ids: Sequence[int], logprobs: Sequence[Any] | None) -> list[float]:
    """The log-prob vLLM reported for each sampled token (position i: `logprobs[i][token_ids[i]]`)."""
    if logprobs is None:
        raise EngineError("vLLM returned no logprobs: the request must set logprobs=1")
    if len(logprobs) != len(token_ids):
        raise EngineError(
            f"vLLM returned {len(logprobs)} logprob entries for {len(token_ids)} tokens"
        )
    out = []
    for i, (tok, entry) in enumerate(zip(token_ids, logprobs, strict=True)):
        try:
            value = _logprob_value(entry[int(tok)])
        except (KeyError, IndexError, TypeError) as exc:
            raise EngineError(
                f"vLLM logprobs at position {i} lack the sampled token {tok}"
            ) from exc
        if not value <= 0.0:
            raise EngineError(f"vLLM log-prob {value} at position {i} is not a log-probability")
        out.append(value)
    return out


def generation_result(completion: Any, versions: Sequence[int]) -> GenerationResult:
    """A `GenerationResult` from a finished vLLM `CompletionOutput`."""
    token_ids = [int(t) for t in completion.token_ids]
    reason = completion.finish_reason
    if reason not in ("stop", "length"):
        raise EngineError(f"vLLM request ended with finish_reason={reason!r}")
    return GenerationResult(
        token_ids=token_ids,
        log_probs=sampled_log_probs(token_ids, completion.logprobs),
        versions=[int(v) for v in versions],
        finish_reason=reason,
    )


def _load_weights_on_worker(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Runs inside vLLM's worker (collective_rpc): hand HF-named tensors to the model."""
    worker.model_runner.model.load_weights(weights=weights)


def _import_vllm() -> SimpleNamespace:
    """The vLLM entry points this adapter uses (imported only when the engine starts)."""
    import vllm
    from vllm.inputs import TokensPrompt

    return SimpleNamespace(
        AsyncLLMEngine=vllm.AsyncLLMEngine,
        AsyncEngineArgs=vllm.AsyncEngineArgs,
        SamplingParams=vllm.SamplingParams,
        TokensPrompt=TokensPrompt,
    )


class VLLMEngine(Engine):
    """vLLM AsyncLLMEngine on a private event-loop thread (single node, one GPU)."""

    def __init__(
        self,
        model: str,
        *,
        seed: int = 0,
        initial_version: int = 0,
        **engine_options: Any,
    ) -> None:
        self.model_path = str(model)
        self.seed = int(seed)
        self.engine_options = {"seed": int(seed), **engine_options}
        self._version = int(initial_version)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._engine: Any = None
        self._vllm: SimpleNamespace | None = None
        self._unpaused: asyncio.Event | None = None
        self._requests = 0

    @property
    def version(self) -> int:
        return self._version

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._vllm = _import_vllm()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="frlab-vllm-engine", daemon=True
        )
        self._thread.start()
        self._call(self._build())

    async def _build(self) -> None:
        import dataclasses

        fields = [f.name for f in dataclasses.fields(self._vllm.AsyncEngineArgs)]
        kwargs = vllm_engine_kwargs(self.model_path, fields, **self.engine_options)
        self._engine = self._vllm.AsyncLLMEngine.from_engine_args(
            self._vllm.AsyncEngineArgs(**kwargs)
        )
        self._unpaused = asyncio.Event()
        self._unpaused.set()

    def shutdown(self) -> None:
        if self._thread is None or self._loop is None:
            return
        if self._engine is not None and hasattr(self._engine, "shutdown"):
            self._loop.call_soon_threadsafe(self._engine.shutdown)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._thread, self._loop, self._engine = None, None, None

    def pause(self) -> None:
        self._call(self._set_paused(True))

    def resume(self) -> None:
        self._call(self._set_paused(False))

    async def _set_paused(self, paused: bool) -> None:
        if paused:
            self._unpaused.clear()
        else:
            self._unpaused.set()

    def _call(self, coro: Any) -> Any:
        """Run `coro` on the engine loop and wait for it (from a non-engine thread)."""
        if self._loop is None:
            coro.close()
            raise EngineError("VLLMEngine is not running: call start() first")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    # -- requests ----------------------------------------------------------------------------
    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams
    ) -> GenerationResult:
        if self._loop is None:
            raise EngineError("VLLMEngine is not running: call start() first")
        prompt = [int(t) for t in prompt_token_ids]
        if not prompt:
            raise ValueError("prompt_token_ids is empty")
        future: concurrent.futures.Future = asyncio.run_coroutine_threadsafe(
            self._generate(prompt, params), self._loop
        )
        return await asyncio.wrap_future(future)

    async def _generate(self, prompt: list[int], params: SamplingParams) -> GenerationResult:
        await self._unpaused.wait()
        self._requests += 1
        sampling = self._vllm.SamplingParams(
            **vllm_sampling_kwargs(params, seed=self.seed + self._requests)
        )
        versions: list[int] = []
        last_version, final = self._version, None
        request_id = f"frlab-{uuid.uuid4().hex}"
        stream = self._engine.generate(
            self._vllm.TokensPrompt(prompt_token_ids=prompt), sampling, request_id
        )
        async for output in stream:
            completion = output.outputs[0]
            new = len(completion.token_ids) - len(versions)
            versions += [min(last_version, self._version)] * new
            last_version, final = self._version, completion
        if final is None:
            raise EngineError("vLLM produced no output for the request")
        return generation_result(final, versions)

    # -- weights -----------------------------------------------------------------------------
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        if int(version) < 0:
            raise ValueError(f"update_weights version must be >= 0, got {version}")
        weights = [(name, t.detach().to("cpu")) for name, t in state_dict.items()]
        self._call(self._update(weights, int(version)))

    async def _update(self, weights: list[tuple[str, torch.Tensor]], version: int) -> None:
        was_paused = not self._unpaused.is_set()
        self._unpaused.clear()
        try:
            await self._engine.collective_rpc(_load_weights_on_worker, args=(weights,))
            if hasattr(self._engine, "reset_prefix_cache"):
                await self._engine.reset_prefix_cache()  # cached KV came from the old weights
            self._version = version
        finally:
            if not was_paused:
                self._unpaused.set()
