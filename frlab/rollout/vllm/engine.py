"""`vllm` engine: vLLM's asynchronous engine in-process, behind the frlab `Engine` interface.

On a GPU with the `vllm` extra, or on a CPU with vLLM's CPU build (scripts/vllm_cpu_env.sh;
frlab.rollout.vllm.platform sets such an engine up). vllm is imported in `start`,
never at module import. The logic that can be checked without an engine lives in pure
functions (frlab.rollout.vllm.args and .outputs, and the worker side in
frlab.rollout.vllm.worker_extension), tested with fakes, against vLLM's own Python code
(the `vllm_contract` tier) and on a real engine on the CPU (the `vllm_cpu` tier).

Behaviour log-probs (FlashREINFORCE paper, Sec. 3) come from vLLM itself: `logprobs=1` returns
the sampled token's log-prob, and the engine runs with `logprobs_mode="processed_logprobs"`,
the log-prob after temperature / top-k / top-p of the distribution sampled from; it refuses to
start otherwise. It runs with `generation_config="vllm"` and every sampling field explicit, so
a model's `generation_config.json` cannot add a penalty the learner never applies. A request
samples with its own seed (`SamplingParams.seed`). vLLM runs on its own event loop in a
background thread; `generate` bridges to it.

Device: each learner rank builds its own engine. vLLM's single-GPU engine core process uses
`cuda:0` of the devices it sees, so the engine starts with `CUDA_VISIBLE_DEVICES` narrowed to
this rank's GPU, restored once the engine-core process has started.

Weight updates (frlab.rollout.vllm.weights): `update_weights` writes the update to
disk and every worker loads it by path (a snapshot through frlab's worker extension, which
acknowledges a fingerprint; with LoRA the adapter only, through vLLM's own LoRA support,
frlab.rollout.vllm.lora), or the engine is broken (it refuses further requests). What
running requests see is `weight_update` (frlab.rollout.engine.WEIGHT_UPDATES), with vLLM's own
RL machinery:

- in_flight: `pause_generation(mode="keep")` freezes every request between two steps, the
  workers load, `update_weight_version` labels what follows, `resume_generation`: running
  requests keep their KV cache (so do prefix-cache hits) and go on with the new weights.
- resubmit: new requests wait; `pause_generation(mode="abort")` ends every running request
  (its tokens and log-probs so far come back) and clears the caches, the workers load; each
  aborted request is sent again as prompt + its tokens with the rest of its budget: a fresh
  prefill on the new weights (frlab.rollout.weight_modes.continue_after_abort, as the remote
  engine does: one that ends on a stop token, or with its budget spent, is not sent again).
- drain: new requests wait, the update waits until every running request has finished, loads
  and resets the prefix cache: no request spans two versions.

Each token's version is vLLM's own label (`CompletionOutput.weight_versions`, vLLM 0.32+,
set by `update_weight_version` while no step runs). A vLLM without those labels is offered
drain only: there a request queued during an update would run on the new weights unseen.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from typing import Any

import torch

from frlab.errors import ConfigError
from frlab.rollout.engine import (
    SEED_LIMIT,
    WEIGHT_UPDATES,
    Engine,
    EngineError,
    GenerationResult,
    SamplingParams,
    request_seed,
    resolve_weight_update,
)
from frlab.rollout.engine_loop import EngineLoop
from frlab.rollout.vllm import platform
from frlab.rollout.vllm.args import (
    check_served_mode,
    check_user_engine_args,
    engine_visible_devices,
    rank_device_index,
    required_engine_options,
    visible_devices,
    vllm_engine_kwargs,
    vllm_sampling_kwargs,
)
from frlab.rollout.vllm.lora import adapter_config, lora_engine_options
from frlab.rollout.vllm.outputs import fragment, token_versions
from frlab.rollout.vllm.platform import import_vllm as _import_vllm
from frlab.rollout.vllm.platform import installed_platform
from frlab.rollout.vllm.weights import WeightsSide
from frlab.rollout.weight_modes import Fragment, continue_after_abort

DOWN_POLL_S = 1.0  # how often a control call waiting on the engine loop checks the core is alive


class VLLMEngine(WeightsSide, Engine):
    """vLLM AsyncLLMEngine on a private event-loop thread (single node, one device)."""

    serves_lora = True  # vLLM's own LoRA serving (frlab.rollout.vllm.lora)
    reserves_gpu_share = True  # weights + KV cache in gpu_memory_utilization of the GPU

    @classmethod
    def check_settings(cls, rollout: Mapping[str, Any], world: int) -> None:
        """The `rollout.vllm_engine_args` a config may set (ConfigError naming the key)."""
        check_user_engine_args(rollout.get("vllm_engine_args") or {})

    @classmethod
    def check_learner(cls, accelerator: str) -> None:
        """Beside a CPU learner it needs a vLLM whose platform is the CPU (vLLM's CPU build):
        asked of the installed vLLM itself."""
        if accelerator in ("gpu", "cuda", "auto"):
            return
        served_on = installed_platform()
        if served_on is None:
            raise ConfigError(
                "trainer.accelerator",
                f"trainer.accelerator={accelerator!r} needs vLLM's CPU build, and no vLLM is "
                "installed: `bash scripts/vllm_cpu_env.sh` builds an environment with it, or use "
                "rollout/engine=torch",
            )
        if served_on != "cpu":
            raise ValueError(
                f"the installed vLLM serves on {served_on or 'no device here'!r}, not on the CPU "
                "of "
                f"trainer.accelerator={accelerator!r}: use a GPU trainer (trainer=gpu), vLLM's "
                "CPU build (scripts/vllm_cpu_env.sh), or rollout/engine=torch"
            )

    @classmethod
    def weight_updates(cls) -> tuple[str, ...]:
        return platform.weight_updates()

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
        weight_update: str | None,
        engine_args: Mapping[str, Any] | None,
    ) -> VLLMEngine:
        """The engine of `rollout/engine=vllm`: vLLM loads `model` (a `gguf:` source is
        converted first) itself; the learner's `policy` reaches it by weight sync. A
        random-init policy (`model` None) is saved to a private folder for vLLM to load."""
        from frlab.model.gguf import resolve_model_source
        from frlab.model.lora import adapter_state_dict, is_peft

        own, lora = None, is_peft(policy)
        if model is None:
            own = tempfile.mkdtemp(prefix="frlab-vllm-model-")
            (copy.deepcopy(policy).unload() if lora else policy).save_pretrained(own)
        engine = cls(
            resolve_model_source(model) if own is None else own,
            seed=seed,
            max_model_len=max_model_len,
            max_in_flight=max_in_flight,
            cpu_kv_cache_gib=cpu_kv_cache_gib,
            weight_update=weight_update,
            **dict(engine_args or {}),
        )
        engine._own_model_dir = own
        if lora:  # vLLM serves the base with the learner's adapter from the first request
            engine.lora = adapter_config(policy)
            engine._adapter = adapter_state_dict(policy.state_dict())
        if policy is not None:
            engine.cpu_dtype = str(policy.dtype).removeprefix("torch.")
        return engine

    def __init__(
        self,
        model: str,
        *,
        seed: int,
        max_in_flight: int,
        cpu_kv_cache_gib: float | None,
        weight_update: str | None,
        initial_version: int = 0,
        device: int | None = None,
        snapshot_dir: str | None = None,
        **engine_options: Any,
    ) -> None:
        """`device`: this process's logical CUDA device the engine runs on (None: this rank's,
        `rank_device_index`); `snapshot_dir`: where weight updates are written (None: a
        private temp folder, removed at shutdown). On a CPU platform the KV cache is
        `cpu_kv_cache_gib` GiB (None: sized for `max_in_flight` sequences of `max_model_len`
        tokens), eager execution is the default, and so is the learner's dtype (`cpu_dtype`,
        set by `for_policy`) unless `dtype` is given."""
        self.model_path = str(model)
        self.seed = int(seed)
        # checked by name now, against what the built engine offers at start
        self.weight_update: str | None = resolve_weight_update(
            weight_update, WEIGHT_UPDATES, "vllm"
        )
        self._requested_update = weight_update
        # token in, token out: vLLM never needs the tokenizer (a random-init model has none)
        self.engine_options = {"seed": int(seed), "skip_tokenizer_init": True, **engine_options}
        required_engine_options(self.engine_options)  # refused before anything is built
        self.device = device
        self.snapshot_dir = snapshot_dir
        self.max_in_flight, self.cpu_kv_cache_gib = int(max_in_flight), cpu_kv_cache_gib
        self.cpu_dtype: str | None = None  # on a CPU: serve in this dtype (the learner's)
        self._own_dir: str | None = None
        self._own_model_dir: str | None = None
        self.lora: dict[str, Any] | None = None  # the adapter's peft config: serve with LoRA
        self._adapter: Mapping[str, torch.Tensor] | None = None  # the adapter served first
        self._lora_request: Any = None  # every request's vLLM LoRARequest (with LoRA)
        self._version = int(initial_version)
        self._runner = EngineLoop("VLLMEngine", "frlab-vllm-engine")
        self._engine: Any = None
        self._vllm: Any = None
        self._requests = 0
        self._labels = False  # the built vLLM labels tokens with weight versions
        # Engine-loop state (touched only on the engine loop once started):
        self._gate: asyncio.Event | None = None  # set while new requests may start
        self._idle: asyncio.Event | None = None  # set while no request is in flight
        self._update_lock: asyncio.Lock | None = None
        self._in_flight = 0
        self._aborts = 0  # resubmit updates so far: an abort after one is ours
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
        """A weight update is under way."""
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
        if self._runner.running:
            return
        self._vllm = _import_vllm()
        self._runner.start()
        try:
            self._call(self._build())
        except BaseException:
            self.shutdown()
            raise

    async def _build(self) -> None:
        fields = [f.name for f in dataclasses.fields(self._vllm.AsyncEngineArgs)]
        options = self.engine_options
        if self.lora is not None:
            options = lora_engine_options(self.lora, options, self._vllm.lora_ranks)
        if self._vllm.platform.is_cpu():
            options = platform.cpu_options(
                self.model_path, options, self.cpu_kv_cache_gib, self.max_in_flight, self.cpu_dtype
            )
        kwargs = vllm_engine_kwargs(self.model_path, fields, **options)
        index = rank_device_index() if self.device is None else int(self.device)
        devices = engine_visible_devices(index, kwargs)
        args = self._vllm.AsyncEngineArgs(**kwargs)
        with visible_devices(devices) if devices is not None else contextlib.nullcontext():
            self._engine = self._vllm.AsyncLLMEngine.from_engine_args(args)
        check_served_mode(self._engine)
        self._labels = platform.labels_tokens(self._vllm, self._engine)
        supported = WEIGHT_UPDATES if self._labels else ("drain",)
        self.weight_update = resolve_weight_update(self._requested_update, supported, "vllm")
        if self._labels:  # tokens are labelled from the first one on
            await self._engine.update_weight_version(str(self._version))
        if self.snapshot_dir is None:
            self._own_dir = tempfile.mkdtemp(prefix="frlab-vllm-weights-")
        self._gate, self._idle, self._update_lock = asyncio.Event(), asyncio.Event(), asyncio.Lock()
        self._idle.set()
        self._refresh_gate()
        if self._adapter is not None:
            await self._add_adapter(self._write(self._adapter, self._version)[0])
            self._adapter = None

    def shutdown(self) -> None:
        for folder in (self._own_dir, self._own_model_dir):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        self._own_dir = self._own_model_dir = None
        self._runner.stop(self._close())
        self._engine = None

    async def _close(self) -> None:
        """Shut vLLM's engine core down (on the engine loop, where it was built)."""
        if self._engine is not None and hasattr(self._engine, "shutdown"):
            self._engine.shutdown()

    def pause(self) -> None:
        """Stop admitting requests and return once every in-flight request has finished, so
        no decode step runs until `resume()` (requests submitted meanwhile wait)."""
        self._call(self._set_paused(True))

    def resume(self) -> None:
        self._call(self._set_paused(False))

    async def _set_paused(self, paused: bool) -> None:
        self._user_paused = paused
        self._refresh_gate()
        if paused:
            await self._drain()

    def _refresh_gate(self) -> None:
        """Open for new requests unless paused or in a drain / resubmit update; a broken
        engine opens it so that waiting requests wake up and fail."""
        if self._broken is not None or not (self._user_paused or self._updating):
            self._gate.set()
        else:
            self._gate.clear()

    async def _drain(self) -> None:
        while self._in_flight:
            await self._idle.wait()

    def _call(self, coro: Any) -> Any:
        """Run `coro` on the engine loop and wait for it (from a non-engine thread); a dead
        engine core ends the wait (a call awaiting it would never return)."""
        return self._runner.call(coro, down=self.down_reason, poll_s=DOWN_POLL_S)

    # -- requests ----------------------------------------------------------------------------
    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams
    ) -> GenerationResult:
        if not self._runner.running:
            raise EngineError("VLLMEngine is not running: call start() first")
        prompt = [int(t) for t in prompt_token_ids]
        if not prompt:
            raise ValueError("prompt_token_ids is empty")
        return await self._runner.submit(self._generate(prompt, params))

    async def _generate(self, prompt: list[int], params: SamplingParams) -> GenerationResult:
        """Submit with this request's seed; after a resubmit update's abort, the rest
        (frlab.rollout.weight_modes.continue_after_abort, see above)."""
        self._requests += 1
        seed = request_seed(params, self.seed, self._requests) % SEED_LIMIT
        seeded = dataclasses.replace(params, seed=seed)
        return await continue_after_abort(self._fragment, prompt, seeded)

    async def _fragment(self, context: list[int], params: SamplingParams) -> Fragment:
        """One submission once the gate is open; an abort that no resubmit update asked for
        (or after a failed load broke the engine) is an EngineError."""
        await self._wait_gate()
        aborts = self._aborts
        final, versions = await self._submit(context, params)
        if final.finish_reason == "abort" and (self._aborts == aborts or self._broken):
            raise EngineError(
                "vLLM request ended with finish_reason='abort', and no weight update asked for it"
            )
        return fragment(final, versions)

    async def _wait_gate(self) -> None:
        while not self._gate.is_set():  # re-check: the gate may close again before we run
            await self._gate.wait()
        if self._broken is not None:
            raise EngineError(self._broken)

    async def _submit(self, context: list[int], params: SamplingParams) -> tuple[Any, list[int]]:
        """One vLLM request: its final CompletionOutput and one version per output token."""
        sampling = self._vllm.SamplingParams(**vllm_sampling_kwargs(params, seed=params.seed))
        version, final = self._version, None
        self._in_flight += 1
        self._idle.clear()
        try:
            lora = {} if self._lora_request is None else {"lora_request": self._lora_request}
            stream = self._engine.generate(
                self._vllm.TokensPrompt(prompt_token_ids=context),
                sampling,
                f"frlab-{uuid.uuid4().hex}",
                **lora,
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
        n = len(final.token_ids)
        if self._labels:  # vLLM's own per-token labels: exact in every mode
            return final, token_versions(getattr(final, "weight_versions", None), n)
        if self._version != version:  # drain (the only mode offered here): a bug, never a lag
            raise EngineError(f"weights changed from {version} to {self._version} mid-request")
        return final, [version] * n
