"""`torch` engine: batched KV-cache sampling from a Hugging Face causal LM in its own thread.

The engine holds its OWN deep copy of the policy (the learner's model keeps training) and
serves `generate` requests from a background thread. Requests waiting when the thread is
free form one wave: their prompts are left-padded into one batch, prefilled once, then
decoded step by step with the model's own `past_key_values`; rows leave the batch (and their
callers resume) as soon as they sample a stop token or reach their token budget.

What it records is what FlashREINFORCE needs (SPEC §3, "store the real sampling
probability"): for each sampled token, the log-prob under the distribution actually sampled
from (logits / temperature, then top-k / top-p if set, renormalised) and the weight version
that sampled it. `update_weights` takes the step lock, so new weights land between two decode
steps; tokens sampled afterwards carry the new version (the KV cache of earlier tokens is
kept, as in-flight updates do in asynchronous RL systems).

With `record_routing=True` (MoE routing replay, frlab.model.routing_replay) every forward also
records the experts each MoE layer picked; each request gets the rows of its own positions:
the last `len(prompt)` columns of the left-padded prefill, then one column per decode step
(rows are re-indexed as finished requests leave the batch).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import inspect
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel

from frlab.model.routing_replay import RoutingRecord, moe_routers, record_routing
from frlab.rollout.engine import Engine, EngineError, GenerationResult, SamplingParams


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    future: concurrent.futures.Future
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    routing: list[torch.Tensor] | None = None  # per-forward [t, L, k] pieces when recording

    def finish(self, reason: str) -> None:
        routing = None if self.routing is None else torch.cat(self.routing, dim=0)
        result = GenerationResult(self.token_ids, self.log_probs, self.versions, reason, routing)
        if not self.future.done():
            self.future.set_result(result)


def sampling_log_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Log-probs [b,V] of the distributions sampled from: logits / T, then top-k/top-p, renormalised."""
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32)
    scaled = logits.float() / temperature.to(logits.device).unsqueeze(1)
    for row, p in enumerate(params):
        if p.top_k > 0 or p.top_p < 1.0:
            scaled[row] = _truncate(scaled[row], p.top_k, p.top_p)
    return torch.log_softmax(scaled, dim=-1)


def _truncate(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) tokens outside the top-k and outside the smallest top-p nucleus."""
    keep = torch.ones_like(scaled, dtype=torch.bool)
    if top_k > 0 and top_k < scaled.numel():
        kth = torch.topk(scaled, top_k).values[-1]
        keep &= scaled >= kth
    if top_p < 1.0:
        order = torch.argsort(scaled, descending=True)
        probs = torch.softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1)[order]
        mass_before = torch.cumsum(probs, dim=0) - probs
        nucleus = torch.zeros_like(keep)
        nucleus[order] = mass_before < top_p
        keep &= nucleus
    return scaled.masked_fill(~keep, float("-inf"))


class TorchEngine(Engine):
    """Sampler over a private copy of `model`, batched across concurrent requests."""

    @classmethod
    def for_policy(
        cls,
        policy: PreTrainedModel,
        *,
        seed: int = 0,
        device: str | torch.device = "cpu",
        max_batch_size: int = 32,
        record_routing: bool = False,
    ) -> TorchEngine:
        """The engine of `rollout/engine=torch`: a copy of the learner's `policy`."""
        return cls(policy, device=device, max_batch_size=max_batch_size, seed=seed,
                   record_routing=record_routing)  # fmt: skip

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        device: str | torch.device = "cpu",
        max_batch_size: int = 32,
        seed: int = 0,
        initial_version: int = 0,
        record_routing: bool = False,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"TorchEngine max_batch_size must be >= 1, got {max_batch_size}")
        self.device = torch.device(device)
        self.max_batch_size = int(max_batch_size)
        self._model = copy.deepcopy(model).to(self.device).eval()
        for p in self._model.parameters():
            p.requires_grad_(False)
            p.grad = None
        self.record_routing = bool(record_routing)
        if self.record_routing:
            try:
                moe_routers(self._model)
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"TorchEngine record_routing=True needs an MoE model: {exc}"
                ) from exc
        self.vocab_size = int(self._model.get_input_embeddings().weight.shape[0])
        self._forward_extra = _forward_kwargs(self._model)
        self._generator = torch.Generator(device=self.device).manual_seed(int(seed))
        self._version = int(initial_version)
        self._pending: list[_Request] = []
        self._cond = threading.Condition()
        self._step_lock = threading.Lock()
        self._paused = False
        self._stopping = False
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    @property
    def model(self) -> PreTrainedModel:
        """The engine's private copy of the weights (read it only while paused)."""
        return self._model

    def start(self) -> None:
        with self._cond:
            if self._stopping:
                raise EngineError("TorchEngine was shut down; build a new engine")
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._serve, name="frlab-torch-engine", daemon=True
            )
            self._thread.start()

    def shutdown(self) -> None:
        with self._cond:
            self._stopping = True
            pending, self._pending = self._pending, []
            self._cond.notify_all()
        for req in pending:
            _fail(req, EngineError("engine shut down before the request ran"))
        if self._thread is not None:
            self._thread.join()

    def pause(self) -> None:
        with self._cond:
            self._paused = True

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    # -- requests ----------------------------------------------------------------------------
    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams
    ) -> GenerationResult:
        req = _Request(self._check_prompt(prompt_token_ids), params, concurrent.futures.Future())
        params.validate(off_policy_correction=False)
        with self._cond:
            if self._stopping or self._thread is None:
                raise EngineError(
                    "TorchEngine is not running: call start() first (or it was shut down)"
                )
            self._pending.append(req)
            self._cond.notify_all()
        return await asyncio.wrap_future(req.future)

    def _check_prompt(self, prompt_token_ids: list[int]) -> list[int]:
        prompt = [int(t) for t in prompt_token_ids]
        if not prompt:
            raise ValueError("prompt_token_ids is empty")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt_token_ids has ids outside [0, {self.vocab_size}): {bad[:5]}")
        return prompt

    # -- weights -----------------------------------------------------------------------------
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        if int(version) < 0:
            raise ValueError(f"update_weights version must be >= 0, got {version}")
        own = self._model.state_dict()
        unknown = sorted(set(state_dict) - set(own))
        missing = sorted(set(own) - set(state_dict))
        if unknown or missing:
            raise KeyError(
                f"update_weights state_dict mismatch: unknown {unknown[:5]}, missing {missing[:5]}"
            )
        for name, tensor in state_dict.items():
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise ValueError(
                    f"update_weights: {name} has shape {tuple(tensor.shape)}, engine {tuple(own[name].shape)}"
                )
        with self._cond:
            was_paused, self._paused = self._paused, True
        try:
            with self._step_lock, torch.no_grad():
                for name, tensor in state_dict.items():
                    own[name].copy_(tensor.detach())
                self._version = int(version)
        finally:
            if not was_paused:
                self.resume()

    # -- the serving thread ------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and (self._paused or not self._pending):
                    self._cond.wait()
                if self._stopping:
                    return
                wave = self._pending[: self.max_batch_size]
                self._pending = self._pending[self.max_batch_size :]
            wave = [r for r in wave if r.future.set_running_or_notify_cancel()]
            if not wave:
                continue
            try:
                self._run_wave(wave)
            except Exception as exc:  # fail this wave, keep serving
                for req in wave:
                    _fail(req, EngineError(f"torch engine step failed: {exc!r}"))

    def _wait_unpaused(self) -> bool:
        """Block while paused; False when the engine is stopping."""
        with self._cond:
            while self._paused and not self._stopping:
                self._cond.wait()
            return not self._stopping

    def _run_wave(self, wave: list[_Request]) -> None:
        with self._recording(wave) as record:
            self._decode(wave, record)

    @contextlib.contextmanager
    def _recording(self, wave: list[_Request]) -> Iterator[RoutingRecord | None]:
        """`record_routing` over the engine's model for one wave (None when not recording)."""
        if not self.record_routing:
            yield None
            return
        for req in wave:
            req.routing = []
        with record_routing(self._model) as record:
            yield record

    def _decode(self, wave: list[_Request], record: RoutingRecord | None) -> None:
        """Prefill, then decode one token per active row until every row has finished."""
        ids, attention, positions = _left_pad([r.prompt for r in wave], self.device)
        cache = DynamicCache()
        extra = dict(self._forward_extra)
        extra[extra.pop("cache_kwarg")] = cache
        active = list(range(len(wave)))
        new_tokens = [len(r.prompt) for r in wave]  # columns each row forwards in this step
        while active:
            if not self._wait_unpaused():
                for i in active:
                    _fail(wave[i], EngineError("engine shut down during generation"))
                return
            with self._step_lock, torch.no_grad():
                out = self._model(
                    input_ids=ids,
                    attention_mask=attention,
                    position_ids=positions,
                    use_cache=True,
                    **extra,
                )
                reqs = [wave[i] for i in active]
                if record is not None:
                    counts = [new_tokens[i] for i in active]
                    _attribute_routing(record.steps.pop(), reqs, counts)
                tokens = self._sample(out.logits[:, -1, :], reqs)
            new_tokens = [1] * len(wave)
            keep = [row for row, req in enumerate(reqs) if not _finished(req)]
            active = [active[row] for row in keep]
            if not active:
                return
            if len(keep) < len(reqs):
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                attention, positions, tokens = attention[index], positions[index], tokens[index]
            ids = tokens.unsqueeze(1)
            attention = torch.cat([attention, torch.ones_like(ids, dtype=attention.dtype)], dim=1)
            positions = positions[:, -1:] + 1

    def _sample(self, logits: torch.Tensor, reqs: list[_Request]) -> torch.Tensor:
        log_probs = sampling_log_probs(logits, [r.params for r in reqs])
        tokens = torch.multinomial(log_probs.exp(), 1, generator=self._generator).squeeze(1)
        chosen = log_probs.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
        version = self._version
        for req, tok, lp in zip(reqs, tokens.tolist(), chosen, strict=True):
            req.token_ids.append(int(tok))
            req.log_probs.append(float(lp))
            req.versions.append(version)
        return tokens


def _attribute_routing(step: torch.Tensor, reqs: list[_Request], counts: list[int]) -> None:
    """Give row `r` of one forward's routing `[b, t, L, k]` to `reqs[r]`: its last `counts[r]`
    columns (a prefill row's left padding sits before its own prompt)."""
    if step.shape[0] != len(reqs):
        raise RuntimeError(f"routing step has {step.shape[0]} rows, the batch has {len(reqs)}")
    for row, (req, n) in enumerate(zip(reqs, counts, strict=True)):
        if req.routing is None:
            raise RuntimeError("routing recorded for a request that is not recording")
        req.routing.append(step[row, step.shape[1] - n :].clone())


def _finished(req: _Request) -> bool:
    """Resolve `req` if it just sampled a stop token or used its budget."""
    if req.token_ids[-1] in req.params.stop_token_ids:
        req.finish("stop")
        return True
    if len(req.token_ids) >= req.params.max_new_tokens:
        req.finish("length")
        return True
    return False


def _forward_kwargs(model: PreTrainedModel) -> dict[str, object]:
    """Name of the forward's cache argument (`cache` in newer transformers, else
    `past_key_values`) and `logits_to_keep=1` where supported (only the last logits are used)."""
    names = inspect.signature(model.forward).parameters
    extra: dict[str, object] = {"cache_kwarg": "cache" if "cache" in names else "past_key_values"}
    if "logits_to_keep" in names:
        extra["logits_to_keep"] = 1
    return extra


def _fail(req: _Request, exc: Exception) -> None:
    if not req.future.done():
        try:
            req.future.set_exception(exc)
        except concurrent.futures.InvalidStateError:
            pass


def _left_pad(prompts: list[list[int]], device: torch.device) -> tuple[torch.Tensor, ...]:
    """Left-padded ids, attention mask and position ids (0 at each row's first real token)."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        attention[row, width - len(prompt) :] = 1
    positions = (attention.cumsum(dim=1) - 1).clamp_min(0)
    return ids.to(device), attention.to(device), positions.to(device)
