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
import shutil
import tempfile
import threading
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from frlab.rollout.engine import (
    Engine,
    EngineError,
    GenerationResult,
    SamplingParams,
    request_seed,
)
from frlab.rollout.engines.vllm_args import (
    check_cpu_memory,
    check_head_size,
    check_served_mode,
    cpu_engine_options,
    cpu_kv_cache_bytes,
    engine_visible_devices,
    rank_device_index,
    required_engine_options,
    visible_devices,
    vllm_engine_kwargs,
    vllm_sampling_kwargs,
)
from frlab.rollout.remote.snapshot import prune_snapshots, write_snapshot
from frlab.rollout.remote.worker_extension import SNAPSHOT_METHOD, check_acks

__all__ = ["VLLMEngine", "generation_result", "sampled_log_probs", "vllm_engine_kwargs",
           "vllm_sampling_kwargs"]  # fmt: skip


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
    from vllm.platforms import current_platform

    return SimpleNamespace(
        AsyncLLMEngine=vllm.AsyncLLMEngine,
        AsyncEngineArgs=vllm.AsyncEngineArgs,
        SamplingParams=vllm.SamplingParams,
        TokensPrompt=TokensPrompt,
        platform=current_platform,
    )


def installed_platform() -> str | None:
    """The device kind the installed vLLM serves on, as vLLM's platform says ("cpu" for its
    CPU build, "cuda", ...); None when vLLM is not installed."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return None
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def cpu_head_sizes() -> list[int] | None:
    """The head sizes vLLM's CPU attention backend declares (None: this vLLM does not say)."""
    try:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        return list(AttentionBackendEnum.CPU_ATTN.get_class().get_supported_head_sizes())
    except (ImportError, AttributeError, KeyError):
        return None


def available_cpu_memory() -> int | None:
    """Bytes free for vLLM's CPU KV cache, as vLLM's CPU worker counts them (its NUMA node's
    figures), else the system's MemAvailable; None when neither can be read."""
    try:
        from vllm.utils.cpu_resource_utils import get_memory_node_info

        return int(get_memory_node_info(0).available_memory)
    except Exception:  # another vLLM release: fall back to the system's figure
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _weight_bytes(folder: str) -> int:
    """Bytes of the safetensors / bin weight files of a local model folder (0 if not local)."""
    path = Path(folder)
    if not path.is_dir():
        return 0
    return sum(p.stat().st_size for p in path.glob("*") if p.suffix in (".safetensors", ".bin"))


DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


class VLLMEngine(Engine):
    """vLLM AsyncLLMEngine on a private event-loop thread (single node, one GPU)."""

    @classmethod
    def for_policy(
        cls,
        policy: Any,
        *,
        seed: int,
        model: str | None,
        max_model_len: int,
        max_in_flight: int,
        cpu_kv_cache_gib: float | None,
        engine_args: Mapping[str, Any] | None,
    ) -> VLLMEngine:
        """The engine of `rollout/engine=vllm`: vLLM loads `model` (a `gguf:` source is
        converted first) itself; the learner's `policy` reaches it by weight sync. A
        random-init policy (`model` None) is saved to a private folder for vLLM to load."""
        from frlab.model.gguf import resolve_model_source

        own = None
        if model is None:
            own = tempfile.mkdtemp(prefix="frlab-vllm-model-")
            policy.save_pretrained(own)
        engine = cls(resolve_model_source(model) if own is None else own, seed=seed,
                     max_model_len=max_model_len, max_in_flight=max_in_flight,
                     cpu_kv_cache_gib=cpu_kv_cache_gib, **dict(engine_args or {}))  # fmt: skip
        engine._own_model_dir = own
        if policy is not None:
            engine.cpu_dtype = str(policy.dtype).removeprefix("torch.")
        return engine

    def __init__(
        self,
        model: str,
        *,
        seed: int = 0,
        initial_version: int = 0,
        device: int | None = None,
        snapshot_dir: str | None = None,
        max_in_flight: int = 32,
        cpu_kv_cache_gib: float | None = None,
        **engine_options: Any,
    ) -> None:
        """`device`: this process's logical CUDA device the engine runs on (None: this rank's,
        `rank_device_index`); `snapshot_dir`: where weight updates are written (None: a
        private temp folder, removed at shutdown). On a CPU platform (vLLM's CPU build) the KV
        cache is `cpu_kv_cache_gib` GiB (None: sized for `max_in_flight` sequences of
        `max_model_len` tokens), eager execution is the default, and so is the learner's dtype
        (`cpu_dtype`, set by `for_policy`) unless `dtype` is given."""
        self.model_path = str(model)
        self.seed = int(seed)
        # token in, token out: vLLM never needs the tokenizer (a random-init model has none)
        self.engine_options = {"seed": int(seed), "skip_tokenizer_init": True, **engine_options}
        required_engine_options(self.engine_options)  # refused before anything is built
        self.device = device
        self.snapshot_dir = snapshot_dir
        self.max_in_flight, self.cpu_kv_cache_gib = int(max_in_flight), cpu_kv_cache_gib
        self.cpu_dtype: str | None = None  # on a CPU: serve in this dtype (the learner's)
        self._own_dir: str | None = None
        self._own_model_dir: str | None = None
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

    @property
    def updating(self) -> bool:
        """A weight update is under way (requests submitted now wait for it to finish)."""
        return self._updating

    def down_reason(self) -> str | None:
        """vLLM's engine core died (its process was killed, it crashed), or a failed weight
        load left this engine refusing requests."""
        engine = self._engine
        if engine is not None and bool(getattr(engine, "errored", False)):
            return f"vLLM's engine core is dead ({engine.dead_error!r})"
        return self._broken

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

    def _cpu_options(self) -> dict[str, Any]:
        """The engine options on vLLM's CPU platform: a head size its attention serves, a KV
        cache sized from config that fits in free memory, eager execution (see vllm_args)."""
        from transformers import AutoConfig

        options = dict(self.engine_options)
        config = AutoConfig.from_pretrained(
            self.model_path, trust_remote_code=bool(options.get("trust_remote_code", False))
        )
        check_head_size(config, cpu_head_sizes())
        if self.cpu_dtype is not None:  # vLLM's "auto" would serve fp32 weights in bf16
            options.setdefault("dtype", self.cpu_dtype)
        dtype = str(options.get("dtype", "auto"))
        if dtype == "auto":
            dtype = str(getattr(config, "dtype", None) or "float32").removeprefix("torch.")
        kv = cpu_kv_cache_bytes(self.cpu_kv_cache_gib, config, self.max_in_flight,
                                int(options.get("max_model_len", 2048)),
                                DTYPE_BYTES.get(dtype, 4))  # fmt: skip
        options = cpu_engine_options(options, kv)
        if "kv_cache_memory_bytes" in options:
            check_cpu_memory(int(options["kv_cache_memory_bytes"]), _weight_bytes(self.model_path),
                             available_cpu_memory())  # fmt: skip
        return options

    async def _build(self) -> None:
        import dataclasses

        fields = [f.name for f in dataclasses.fields(self._vllm.AsyncEngineArgs)]
        cpu = bool(self._vllm.platform.is_cpu())
        options = self._cpu_options() if cpu else self.engine_options
        kwargs = vllm_engine_kwargs(self.model_path, fields, **options)
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
        for folder in (self._own_dir, self._own_model_dir):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        self._own_dir = self._own_model_dir = None
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
            **vllm_sampling_kwargs(params, seed=request_seed(params, self.seed, self._requests))
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
        except (EngineError, asyncio.CancelledError):
            raise
        except Exception as exc:  # vLLM's own errors (EngineDeadError, ...) as EngineError
            raise EngineError(f"vLLM request failed: {exc!r}") from exc
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
