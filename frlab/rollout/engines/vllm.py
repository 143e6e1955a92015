"""`vllm` engine: vLLM's asynchronous engine in-process, behind the frlab `Engine` interface.

GPU only (extra `vllm`); `vllm` is imported inside `VLLMEngine.start`, never at module import,
so `import frlab.rollout` stays light. The adapter is thin on purpose: the logic that can be
checked without a GPU lives in pure functions (`vllm_sampling_kwargs`, `vllm_engine_kwargs`,
`sampled_log_probs`, `generation_result`, `rank_visible_devices`, and the worker side in
`frlab.rollout.remote.worker_extension`), tested on CPU with fakes and, in the
`vllm_contract` tier, against vLLM's own Python code (its `SamplingParams`,
`AsyncEngineArgs`, msgspec serialiser and worker class).

Behaviour log-probs (FlashREINFORCE paper, Sec. 3) come from vLLM itself: `logprobs=1` returns
the sampled token's log-prob, and the engine runs with `logprobs_mode="processed_logprobs"`
so it is the log-prob after temperature / top-k / top-p, i.e. of the distribution sampled
from: the engine refuses to start without it (a vLLM without the field, an override in
`rollout.vllm_engine_args`, or a built engine whose config reports another mode). It runs
with `generation_config="vllm"` and every sampling field explicit (penalties neutral), so
the model's `generation_config.json` cannot add a penalty the learner never applies.
vLLM runs on its own event loop in a background thread; `generate` bridges to it.

Device: each learner rank builds its own engine. vLLM's single-GPU engine core process
uses `cuda:0` of the devices it sees (`vllm/v1/worker/gpu_worker.py`, `Worker.init_device`),
so the engine is started with `CUDA_VISIBLE_DEVICES` narrowed to this rank's GPU
(`torch.cuda.current_device()`, else `LOCAL_RANK`; an inherited list is indexed), restored
once the engine-core process has started.

Weight updates use vLLM's RLHF path: the engine is built with
`worker_extension_cls="frlab.rollout.remote.worker_extension.WeightUpdateExtension"` and
`update_weights` writes a safetensors snapshot (private temp folder) and calls
`collective_rpc("frlab_load_snapshot", args=(path, version, fingerprint))`: a path and plain
values survive vLLM's msgspec transport to the engine-core process, tensors inside rpc
arguments do not (they arrive without their buffers). Every worker streams the file through
`Worker.reload_weights(..., is_checkpoint_format=True)` and acknowledges the version and a
fingerprint of the tensors it loaded; a missing or different acknowledgement, or a prefix-cache
reset that does not report success, is an error and leaves the engine refusing requests (its
weights may be half-loaded).

Versions are exact, not conservative. `pause()` and `update_weights` first stop admitting
requests, then WAIT for every in-flight request to finish (each is one turn, bounded by
`max_new_tokens`), so no request ever runs across a weight change: all its tokens carry the
version seen when it started, and that version sampled all of them, KV cache included (the
prefix cache is reset after loading, when no request is running). We drain rather than use
vLLM's `pause_generation(mode="keep")` because frozen requests would resume on a KV cache
computed by the old weights. The cost: an update waits for the longest in-flight turn.

What has run where: the `vllm_contract` tests build this adapter's engine arguments and
sampling parameters with vLLM's own classes and pass its rpc arguments through vLLM's own
serialiser on CPU; the engine itself (generation, a weight update on a GPU) has not run:
`scripts/gpu_check.sh` runs it where a GPU and vllm exist.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import torch

from frlab.rollout.engine import Engine, EngineError, GenerationResult, SamplingParams
from frlab.rollout.remote.snapshot import prune_snapshots, write_snapshot
from frlab.rollout.remote.worker_extension import (
    SNAPSHOT_METHOD,
    WORKER_EXTENSION_CLS,
    check_acks,
)

PROCESSED_LOGPROBS = "processed_logprobs"


def vllm_sampling_kwargs(params: SamplingParams, *, seed: int | None = None) -> dict[str, Any]:
    """Keyword arguments for `vllm.SamplingParams` that reproduce frlab's sampling contract:
    stop only on `stop_token_ids` (eos ignored, as in the torch engine), one sampled-token
    log-prob per step, no detokenisation (token in, token out), every other sampling field
    neutral and explicit (no penalty, min_p 0, top_k 0 = off)."""
    params.validate(off_policy_correction=False)
    kwargs: dict[str, Any] = {
        "n": 1,
        "temperature": float(params.temperature),
        "top_p": float(params.top_p),
        "top_k": int(params.top_k),
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
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
    method name), processed log-probs and vLLM's neutral generation config (`supported`: the
    installed vLLM's field names). ValueError naming the `rollout.vllm_engine_args` key of an
    unknown option, or of one that would change what the behaviour log-probs mean."""
    names = set(supported)
    kwargs: dict[str, Any] = {"model": model, **options}
    unknown = sorted(k for k in kwargs if k not in names)
    if unknown:
        raise ValueError(
            f"rollout.vllm_engine_args: vLLM AsyncEngineArgs has no field(s): {', '.join(unknown)}"
        )
    for field in ("worker_extension_cls", "logprobs_mode", "generation_config"):
        if field not in names:
            raise ValueError(
                f"the installed vLLM has no AsyncEngineArgs.{field}, which frlab needs: install "
                "the `vllm` extra (vllm>=0.28,<0.30)"
            )
    return {**kwargs, **required_engine_options(kwargs)}


_REQUIRED = {
    "worker_extension_cls": (WORKER_EXTENSION_CLS, "update_weights calls its methods by name"),
    "logprobs_mode": (PROCESSED_LOGPROBS, "the behaviour log-probs must be those of the "
                      "distribution sampled from, after temperature"),
    "generation_config": ("vllm", "the model's generation_config.json would change sampling "
                          "defaults, e.g. a repetition penalty the learner never applies"),
}  # fmt: skip


def required_engine_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The engine arguments frlab fixes; ValueError naming `rollout.vllm_engine_args.<key>`
    when `options` sets one of them to another value."""
    for field, (value, why) in _REQUIRED.items():
        if field in options and options[field] != value:
            raise ValueError(
                f"rollout.vllm_engine_args.{field} must be {value!r} ({why}), "
                f"got {options[field]!r}"
            )
    return {field: value for field, (value, _) in _REQUIRED.items()}


def check_served_mode(engine: Any) -> None:
    """EngineError unless the built engine's config reports processed log-probs."""
    model_config = getattr(getattr(engine, "vllm_config", None), "model_config", None)
    mode = getattr(model_config, "logprobs_mode", None)
    if str(getattr(mode, "value", mode)) != PROCESSED_LOGPROBS:
        raise EngineError(
            f"the vLLM engine reports logprobs_mode={mode!r}, not {PROCESSED_LOGPROBS!r}: its "
            "log-probs would not be those of the distribution sampled from; refusing to start"
        )


def rank_visible_devices(index: int, visible: str | None) -> str:
    """The `CUDA_VISIBLE_DEVICES` that shows an engine only logical CUDA device `index` of
    this process: entry `index` of the inherited list `visible`, or `index` itself."""
    if index < 0:
        raise EngineError(f"CUDA device index {index} is negative")
    if visible is None or not visible.strip():
        return str(index)
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if index >= len(entries):
        raise EngineError(
            f"CUDA device {index} of this rank is not among CUDA_VISIBLE_DEVICES={visible!r}"
        )
    return entries[index]


def rank_device_index() -> int:
    """This process's CUDA device: the current one once CUDA is initialised (Lightning sets it
    per rank), else `LOCAL_RANK` (0 when unset)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.current_device())
    return int(os.environ.get("LOCAL_RANK", "0"))


@contextlib.contextmanager
def visible_devices(value: str) -> Iterator[None]:
    """Set `CUDA_VISIBLE_DEVICES` while vLLM starts its engine-core process, then restore it."""
    old = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = old


def engine_visible_devices(index: int, options: Mapping[str, Any]) -> str | None:
    """The devices this rank's engine may see (None: leave them as they are). Tensor or
    pipeline parallel engines span several GPUs and are left alone on device 0 only."""
    parallel = int(options.get("tensor_parallel_size", 1)) * int(
        options.get("pipeline_parallel_size", 1)
    )
    if parallel > 1:
        if index != 0:
            raise EngineError(
                "rollout.vllm_engine_args: a tensor/pipeline parallel in-process engine per "
                f"learner rank is not supported (this rank is on CUDA device {index}); serve "
                "the model with rollout=remote instead"
            )
        return None
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0" and index != 0:
        raise EngineError(
            "VLLM_ENABLE_V1_MULTIPROCESSING=0 runs vLLM's engine core in this process, where it "
            f"would use cuda:0, not this rank's device {index}: unset it"
        )
    return rank_visible_devices(index, os.environ.get("CUDA_VISIBLE_DEVICES"))


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

    def __init__(
        self,
        model: str,
        *,
        seed: int = 0,
        initial_version: int = 0,
        device: int | None = None,
        snapshot_dir: str | None = None,
        **engine_options: Any,
    ) -> None:
        """`device`: this process's logical CUDA device the engine runs on (None: this rank's,
        `rank_device_index`); `snapshot_dir`: where weight updates are written (None: a
        private temp folder, removed at shutdown)."""
        self.model_path = str(model)
        self.seed = int(seed)
        self.engine_options = {"seed": int(seed), **engine_options}
        required_engine_options(self.engine_options)  # refused before anything is built
        self.device = device
        self.snapshot_dir = snapshot_dir
        self._own_dir: str | None = None
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
        try:
            self._call(self._build())
        except BaseException:
            self.shutdown()
            raise

    async def _build(self) -> None:
        import dataclasses

        fields = [f.name for f in dataclasses.fields(self._vllm.AsyncEngineArgs)]
        kwargs = vllm_engine_kwargs(self.model_path, fields, **self.engine_options)
        index = rank_device_index() if self.device is None else int(self.device)
        devices = engine_visible_devices(index, kwargs)
        args = self._vllm.AsyncEngineArgs(**kwargs)
        with visible_devices(devices) if devices is not None else contextlib.nullcontext():
            self._engine = self._vllm.AsyncLLMEngine.from_engine_args(args)
        check_served_mode(self._engine)
        if self.snapshot_dir is None:
            self._own_dir = tempfile.mkdtemp(prefix="frlab-vllm-weights-")
        self._gate, self._idle, self._update_lock = asyncio.Event(), asyncio.Event(), asyncio.Lock()
        self._idle.set()
        self._refresh_gate()

    def shutdown(self) -> None:
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
            self._own_dir = None
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
        """Write `state_dict` (HF names) as a snapshot, drain in-flight requests, have every
        worker load it through the frlab worker extension, check their acknowledgements,
        reset the prefix cache, then bump the version and admit requests again."""
        if int(version) < 0:
            raise ValueError(f"update_weights version must be >= 0, got {version}")
        if not state_dict:
            raise ValueError("update_weights got an empty state_dict")
        folder = self.snapshot_dir or self._own_dir
        if folder is None:
            raise EngineError("VLLMEngine is not running: call start() first")
        path, fingerprint = write_snapshot(state_dict, folder, int(version))
        self._call(self._update(str(path), int(version), fingerprint))
        prune_snapshots(folder, keep=1)  # every worker has loaded it (or the engine is broken)

    async def _update(self, path: str, version: int, sent: Mapping[str, Any]) -> None:
        async with self._update_lock:
            if self._broken is not None:
                raise EngineError(self._broken)
            self._updating = True
            self._refresh_gate()
            try:
                await self._drain()
                await self._load(path, version, sent)
                self._version = version
            finally:
                self._updating = False
                self._refresh_gate()

    async def _load(self, path: str, version: int, sent: Mapping[str, Any]) -> None:
        """Load on the workers; any failure marks the engine broken (weights may be mixed)."""
        try:
            acks = await self._engine.collective_rpc(
                SNAPSHOT_METHOD, args=(path, version, dict(sent))
            )
            check_acks(acks, version, sent)
            # cached KV came from the old weights; no request runs now, so it must succeed
            reset = await self._engine.reset_prefix_cache()
            if reset is not True:
                raise EngineError(f"vLLM's prefix-cache reset answered {reset!r}, not True")
        except Exception as exc:
            self._broken = (
                f"vLLM weight update to version {version} failed ({exc}); the engine's weights "
                "may be partly updated, so it refuses further requests: restart it"
            )
            raise EngineError(self._broken) from exc
