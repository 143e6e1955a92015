"""`vllm` engine: vLLM's asynchronous engine in-process, behind the frlab `Engine` interface.

GPU only (extra `vllm`); `vllm` is imported inside `VLLMEngine.start`, never at module import,
so `import frlab.rollout` stays light. The adapter is thin on purpose: the logic that can be
checked without a GPU lives in pure functions tested on CPU with fake vLLM objects
(`vllm_sampling_kwargs`, `vllm_engine_kwargs`, `sampled_log_probs`, `generation_result`, and
the worker side in `frlab.rollout.remote.worker_extension`).

Behaviour log-probs (SPEC §3) come from vLLM itself: `logprobs=1` returns the sampled token's
log-prob, and the engine runs with `logprobs_mode="processed_logprobs"` (vLLM >= 0.10.2) so
it is the log-prob after temperature / top-k / top-p, i.e. of the distribution sampled from.
vLLM runs on its own event loop in a background thread; `generate` bridges to it from the
caller's loop.

Weight updates use vLLM's in-process RLHF path: the engine is built with
`worker_extension_cls="frlab.rollout.remote.worker_extension.WeightUpdateExtension"` and `update_weights`
calls the worker method by NAME, `collective_rpc("frlab_load_weights", args=(weights,
version))` (vLLM V1 ships only names, not callables, to its worker processes unless
`VLLM_ALLOW_INSECURE_SERIALIZATION=1`). Every worker acknowledges the version and a
fingerprint of the tensors it loaded; a missing or different acknowledgement is an error
and leaves the engine refusing requests (its weights may be half-loaded).

Versions are exact, not conservative. `pause()` and `update_weights` first stop admitting
requests, then WAIT for every in-flight request to finish (each is one turn, bounded by
`max_new_tokens`), so no request ever runs across a weight change: all its tokens carry the
version seen when it started, and that version sampled all of them, KV cache included (the
prefix cache is reset after loading, when no request is running). We drain rather than use
vLLM's `pause_generation(mode="keep")` because frozen requests would resume on a KV cache
computed by the old weights, so their later tokens would claim weights that did not wholly
sample them (and that API's signature changed between vLLM releases). The cost: an update
waits for the longest in-flight turn.

What has run where: NOTHING in this module has run on a GPU or against a real vLLM (none
was available: vllm has no CPU wheel, and the lent GPU machine has no vllm). The CPU tests
drive it with a fake AsyncLLM that dispatches `collective_rpc` by method name to a fake
worker carrying `WeightUpdateExtension`. The vLLM API used (`AsyncLLMEngine.from_engine_args`,
`generate`, `collective_rpc(method, timeout, args, kwargs)`, `reset_prefix_cache`,
`AsyncEngineArgs.worker_extension_cls`) was read from vLLM's documentation and source, not
exercised; `test_real_vllm_log_probs_match_a_forward` (marker `vllm`) is the first check to
run where a GPU and vllm exist.
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
from frlab.rollout.remote.worker_extension import (
    LOAD_WEIGHTS_METHOD,
    WORKER_EXTENSION_CLS,
    check_acks,
    weights_fingerprint,
)


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
    """`AsyncEngineArgs` keywords: `model`, `options`, frlab's worker extension (weight sync by
    method name) and processed log-probs where the installed vLLM supports `logprobs_mode`
    (`supported`: its field names). Unknown option names raise ValueError naming them."""
    names = set(supported)
    kwargs: dict[str, Any] = {"model": model, **options}
    unknown = sorted(k for k in kwargs if k not in names)
    if unknown:
        raise ValueError(
            f"rollout.vllm_engine_args: vLLM AsyncEngineArgs has no field(s): {', '.join(unknown)}"
        )
    if "worker_extension_cls" not in names:
        raise ValueError(
            "the installed vLLM has no AsyncEngineArgs.worker_extension_cls, which frlab's "
            "weight sync needs: install the `vllm` extra (vllm>=0.28,<0.30)"
        )
    given = kwargs.setdefault("worker_extension_cls", WORKER_EXTENSION_CLS)
    if given != WORKER_EXTENSION_CLS:
        raise ValueError(
            f"worker_extension_cls must be {WORKER_EXTENSION_CLS!r} (update_weights calls its "
            f"methods by name), got {given!r}"
        )
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

    @classmethod
    def for_policy(
        cls,
        policy: Any,
        *,
        seed: int = 0,
        model: str,
        max_model_len: int,
        engine_args: Mapping[str, Any] | None = None,
    ) -> VLLMEngine:
        """The engine of `rollout/engine=vllm`: vLLM loads `model` (a `gguf:` source is
        converted first) itself; the learner's `policy` reaches it by weight sync."""
        from frlab.model.gguf import resolve_model_source

        return cls(resolve_model_source(model), seed=seed, max_model_len=max_model_len,
                   **dict(engine_args or {}))  # fmt: skip

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
        self._requests = 0
        # Engine-loop state (touched only on the engine loop once started):
        self._gate: asyncio.Event | None = None  # set while new requests may start
        self._idle: asyncio.Event | None = None  # set while no request is in flight
        self._update_lock: asyncio.Lock | None = None
        self._in_flight = 0
        self._user_paused = self._updating = False
        self._broken: str | None = None

    @property
    def version(self) -> int:
        return self._version

    @property
    def in_flight(self) -> int:
        """Requests submitted to vLLM and not yet finished."""
        return self._in_flight

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
        self._gate, self._idle, self._update_lock = asyncio.Event(), asyncio.Event(), asyncio.Lock()
        self._idle.set()
        self._refresh_gate()

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
        """Stop admitting requests and return once every in-flight request has finished, so
        no decode step runs until `resume()` (requests submitted meanwhile wait)."""
        self._call(self._pause())

    def resume(self) -> None:
        self._call(self._resume())

    async def _pause(self) -> None:
        self._user_paused = True
        self._refresh_gate()
        await self._drain()

    async def _resume(self) -> None:
        self._user_paused = False
        self._refresh_gate()

    def _refresh_gate(self) -> None:
        """Open for new requests unless paused or updating; a broken engine opens it so that
        waiting requests wake up and fail."""
        if self._broken is not None or not (self._user_paused or self._updating):
            self._gate.set()
        else:
            self._gate.clear()

    async def _drain(self) -> None:
        while self._in_flight:
            await self._idle.wait()

    def _call(self, coro: Any) -> Any:
        """Run `coro` on the engine loop and wait for it (from a non-engine thread)."""
        if self._loop is None:
            coro.close()
            raise EngineError("VLLMEngine is not running: call start() first")
        if threading.current_thread() is self._thread:
            coro.close()
            raise EngineError("VLLMEngine control calls must not run on its own loop thread")
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
        while not self._gate.is_set():  # re-check: the gate may close again before we run
            await self._gate.wait()
        if self._broken is not None:
            raise EngineError(self._broken)
        self._requests += 1
        sampling = self._vllm.SamplingParams(
            **vllm_sampling_kwargs(params, seed=self.seed + self._requests)
        )
        version, final = self._version, None
        self._in_flight += 1
        self._idle.clear()
        try:
            stream = self._engine.generate(
                self._vllm.TokensPrompt(prompt_token_ids=prompt),
                sampling,
                f"frlab-{uuid.uuid4().hex}",
            )
            async for output in stream:
                final = output.outputs[0]
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()
        if final is None:
            raise EngineError("vLLM produced no output for the request")
        if self._version != version:  # updates drain first, so this is a bug, never a lag
            raise EngineError(f"weights changed from {version} to {self._version} mid-request")
        return generation_result(final, [version] * len(final.token_ids))

    # -- weights -----------------------------------------------------------------------------
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Drain in-flight requests, load `state_dict` (HF names) on every worker through the
        frlab worker extension, check their acknowledgements, reset the prefix cache, then
        bump the version and admit requests again."""
        if int(version) < 0:
            raise ValueError(f"update_weights version must be >= 0, got {version}")
        weights = [(str(name), t.detach().to("cpu")) for name, t in state_dict.items()]
        if not weights:
            raise ValueError("update_weights got an empty state_dict")
        self._call(self._update(weights, int(version), weights_fingerprint(weights)))

    async def _update(
        self, weights: list[tuple[str, torch.Tensor]], version: int, sent: Mapping[str, Any]
    ) -> None:
        async with self._update_lock:
            if self._broken is not None:
                raise EngineError(self._broken)
            self._updating = True
            self._refresh_gate()
            try:
                await self._drain()
                await self._load(weights, version, sent)
                self._version = version
            finally:
                self._updating = False
                self._refresh_gate()

    async def _load(
        self, weights: list[tuple[str, torch.Tensor]], version: int, sent: Mapping[str, Any]
    ) -> None:
        """Load on the workers; any failure marks the engine broken (weights may be mixed)."""
        try:
            acks = await self._engine.collective_rpc(LOAD_WEIGHTS_METHOD, args=(weights, version))
            check_acks(acks, version, sent)
            if hasattr(self._engine, "reset_prefix_cache"):
                # cached KV came from the old weights; no request runs now, so it must succeed
                if await self._engine.reset_prefix_cache() is False:
                    raise EngineError("vLLM refused to reset its prefix cache")
        except Exception as exc:
            self._broken = (
                f"vLLM weight update to version {version} failed ({exc}); the engine's weights "
                "may be partly updated, so it refuses further requests: restart it"
            )
            raise EngineError(self._broken) from exc
