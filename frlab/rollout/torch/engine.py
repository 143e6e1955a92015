"""`torch` engine: continuous-batching KV-cache sampling from a Hugging Face causal LM.

The engine holds its OWN deep copy of the policy (the learner's model keeps training) and
serves `generate` requests from a background thread. Each iteration of that thread admits the
requests waiting in the queue (up to `max_batch_size` rows in all): they are prefilled
together, packed end to end in one row or left-padded, whichever the model's shape makes
cheaper (frlab.rollout.torch.prefill), and merged into the running batch
(frlab.rollout.torch.kv_batch); then
one decode step feeds every row's last token through the shared KV cache. A row leaves the
batch (and its caller resumes) as soon as it samples a stop token or reaches its token
budget, and a waiting request takes its place at the next iteration.

What it records is what FlashREINFORCE needs (paper, Sec. 3: store the real sampling
probability): for each sampled token, the log-prob under the distribution actually sampled
from (logits / temperature, then top-k / top-p if set, renormalised:
frlab.rollout.torch.sampling) and the weight version that sampled it. A request with
`SamplingParams.seed` draws from its own generator, so its tokens do not depend on the other
rows. `update_weights` takes the step lock, so new weights land between two decode steps;
tokens sampled afterwards carry the new version. What happens to running requests is the
engine's `weight_update` mode (frlab.rollout.engine.WEIGHT_UPDATES): `in_flight` keeps their
KV cache (as in-flight updates do in asynchronous RL systems), `resubmit` drops it and
prefills prompt + tokens so far again on the new weights at the next step, `drain` admits no
request until the running ones have finished and only then loads.

With `record_routing=True` (MoE routing replay, frlab.model.routing_replay) every forward also
records the experts each MoE layer picked; each request gets the rows of its own positions:
the last `len(prompt)` columns of its prefill, then one column per decode step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from frlab.model.lora import base_of
from frlab.model.routing_replay import RoutingRecord, record_routing
from frlab.rollout.engine import (
    WEIGHT_UPDATES,
    Engine,
    EngineError,
    GenerationResult,
    SamplingParams,
    resolve_weight_update,
)
from frlab.rollout.torch import prefill
from frlab.rollout.torch.common import check_prompt, check_update, private_copy, require_moe
from frlab.rollout.torch.request_state import Request, awaitable, fail
from frlab.rollout.torch.sampling import draw, request_generator
from frlab.rollout.weight_modes import wait_drained

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from frlab.rollout.torch.kv_batch import DecodeRows, GrowingCache

log = logging.getLogger(__name__)
Span = tuple[int, int, int]  # (row, first, end) of a request's positions in one forward


class TorchEngine(Engine):
    """Sampler over a private copy of `model`, batched across concurrent requests."""

    @classmethod
    def for_policy(cls, policy: PreTrainedModel, **settings: Any) -> TorchEngine:
        """The engine of `rollout/engine=torch`: a copy of the learner's `policy` (`settings`
        are the constructor's keywords, from the engine node)."""
        return cls(policy, **settings)

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        device: str | torch.device,
        max_batch_size: int,
        seed: int,
        record_routing: bool,
        packed_prefill: bool,
        weight_update: str | None,
        initial_version: int = 0,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"TorchEngine max_batch_size must be >= 1, got {max_batch_size}")
        self.weight_update = resolve_weight_update(
            weight_update, self.weight_updates(), "torch", record_routing=record_routing
        )
        self.device = torch.device(device)
        self.max_batch_size = int(max_batch_size)
        self._model = self._private_model(model)
        self.record_routing = bool(record_routing)
        if self.record_routing:
            require_moe(self._model, "TorchEngine record_routing=True")
        self.vocab_size = int(self._model.get_input_embeddings().weight.shape[0])
        self._cache_kwarg, self._forward_extra = _forward_kwargs(base_of(self._model))
        self._prefill_cost = prefill.packing_cost(
            self._model, self._logits, self.device, packed_prefill
        )
        self._generator = torch.Generator().manual_seed(int(seed))  # requests without a seed
        self._version = int(initial_version)
        self._pending: list[Request] = []
        self._cond = threading.Condition()
        self._step_lock = threading.Lock()
        self._paused = False
        self._stopping = False
        self._running = 0  # rows decoding at the serving thread's last admission
        self._draining = False  # drain: admit nothing until the running rows have finished
        self._resubmit = False  # resubmit: re-prefill every running row at the next step
        self._thread: threading.Thread | None = None
        self._record: RoutingRecord | None = None  # open while the serving thread runs

    def _private_model(self, model: PreTrainedModel) -> PreTrainedModel:
        return private_copy(model, self.device)

    @property
    def packed_prefill(self) -> bool:
        """Whether prompts may be prefilled packed in one row (see frlab.rollout.torch.prefill)."""
        return self._prefill_cost is not None

    serves_lora = True  # its copy of the policy is the learner's PeftModel
    records_routing = True  # frlab.model.routing_replay hooks on its own forward

    @classmethod
    def weight_updates(cls) -> tuple[str, ...]:
        return WEIGHT_UPDATES  # all three, in_flight by default

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
            fail(req, EngineError("engine shut down before the request ran"))
        if self._thread is not None:
            self._thread.join()

    def down_reason(self) -> str | None:
        """The serving thread ended without a shutdown (it serves until stopped otherwise)."""
        thread = self._thread
        if thread is None or thread.is_alive() or self._stopping:
            return None
        return "the torch engine's serving thread ended"

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
        (future,) = self.generate_many([(prompt_token_ids, params)])
        return await future

    def generate_many(
        self, requests: Sequence[tuple[list[int], SamplingParams]]
    ) -> list[asyncio.Future[GenerationResult]]:
        """Enqueue `requests` atomically, in order (they join the batch together); validates
        all of them first, so a bad one raises before any is queued."""
        return [awaitable(req) for req in self._enqueue(requests)]

    def _enqueue(self, requests: Sequence[tuple[list[int], SamplingParams]]) -> list[Request]:
        """Validate every request, then queue them together; their concurrent futures resolve
        from the serving thread (no event loop needed)."""
        reqs = []
        for prompt, params in requests:
            params.validate(off_policy_correction=False)
            reqs.append(
                Request(
                    check_prompt(prompt, self.vocab_size),
                    params,
                    concurrent.futures.Future(),
                    request_generator(params.seed),
                )
            )
        with self._cond:
            if self._stopping or self._thread is None:
                raise EngineError(
                    "TorchEngine is not running: call start() first (or it was shut down)"
                )
            self._pending.extend(reqs)
            self._cond.notify_all()
        return reqs

    # -- weights -----------------------------------------------------------------------------
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load `state_dict` between two decode steps as `weight_update` says (see above)."""
        own = check_update(self._model, state_dict, version)
        if self.weight_update == "drain":
            self._drain()
        with self._cond:
            was_paused, self._paused = self._paused, True
        try:
            with self._step_lock, torch.no_grad():
                for name, tensor in state_dict.items():
                    own[name].copy_(tensor.detach())
                self._version = int(version)
                self._resubmit = self.weight_update == "resubmit"
        finally:
            with self._cond:
                self._draining = False
                self._cond.notify_all()
            if not was_paused:
                self.resume()

    def _drain(self) -> None:
        """Admit nothing more and wait until no row is decoding, or the serving thread has
        ended (frlab.rollout.weight_modes.wait_drained: EngineError past the deadline, which
        leaves the weights as they were and admission open)."""
        with self._cond:
            self._draining = True
            self._cond.notify_all()
            try:
                wait_drained(self._decoding, lambda left: self._cond.wait(min(left, 1.0)))
            except EngineError:
                self._draining = False
                self._cond.notify_all()
                raise

    def _decoding(self) -> int:
        """Rows decoding at the serving thread's last admission (0 once it has ended)."""
        thread = self._thread
        return self._running if thread is not None and thread.is_alive() else 0

    # -- the serving thread ------------------------------------------------------------------
    def _serve(self) -> None:
        """The serving thread: MoE routing is recorded (if asked) for the thread's lifetime."""
        recording = record_routing(self._model) if self.record_routing else contextlib.nullcontext()
        with recording as record:
            self._record = record
            self._serve_loop()

    def _serve_loop(self) -> None:
        rows: DecodeRows | None = None
        reqs: list[Request] = []  # the requests of `rows`, row by row
        while True:
            newcomers = self._admit(len(reqs))
            if newcomers is None:  # stopping
                for req in reqs:
                    fail(req, EngineError("engine shut down during generation"))
                return
            try:
                with self._step_lock, torch.inference_mode():
                    if self._take_resubmit() and reqs:  # new weights: prefill them afresh
                        rows, reqs, newcomers = None, [], reqs + newcomers
                    rows, reqs = self._iterate(rows, reqs, newcomers)
            except Exception as exc:  # fail this batch, keep serving
                for req in reqs + newcomers:
                    fail(req, EngineError(f"torch engine step failed: {exc!r}"))
                rows, reqs = None, []

    def _admit(self, running: int) -> list[Request] | None:
        """Wait until there is work and the engine is not paused; take the queued requests
        that fit next to `running` rows (None when stopping; none while draining)."""
        with self._cond:
            while not self._stopping and (
                self._paused or (not running and (not self._pending or not self._admitting()))
            ):
                self._publish_running(running)
                self._cond.wait(self._admit_poll_s)
            if self._stopping:
                return None
            if not self._admitting():
                self._publish_running(running)
                return []
            room = self.max_batch_size - running
            taken, self._pending = self._pending[:room], self._pending[room:]
            taken = [r for r in taken if r.future.set_running_or_notify_cancel()]
            self._publish_running(running + len(taken))  # after the decision: drain counts it
        return taken

    # Hooks of the weight-update modes (the torch_process child keeps them in shared memory).
    _admit_poll_s: float | None = None  # how often a waiting serving thread re-checks them

    def _publish_running(self, running: int) -> None:
        self._running = running
        if self._draining:
            self._cond.notify_all()  # an update waits for 0

    def _admitting(self) -> bool:
        return not self._draining

    def _take_resubmit(self) -> bool:
        """Whether an update asked to re-prefill the running rows (cleared); under the lock."""
        asked, self._resubmit = self._resubmit, False
        return asked

    def _iterate(
        self, rows: DecodeRows | None, reqs: list[Request], newcomers: list[Request]
    ) -> tuple[DecodeRows | None, list[Request]]:
        """Prefill `newcomers` into the batch, then one decode step for every row."""
        # imported here: its cache classes subclass transformers' own, and asking this class
        # what it supports (preflight) need not import transformers
        from frlab.rollout.torch.steps import decode_step, prefill_requests

        if newcomers:
            fresh, fresh_reqs = prefill_requests(self, newcomers)
            if fresh is not None:
                rows = fresh if rows is None else rows.merge(fresh)
                reqs = reqs + fresh_reqs
        if rows is None:
            return None, []
        return decode_step(self, rows, reqs)

    def _forward(
        self,
        ids: torch.Tensor,
        attention: torch.Tensor,
        positions: torch.Tensor,
        cache: GrowingCache,
        reqs: list[Request],
        spans: list[Span] | None = None,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [requests, V] of one cached forward; routing attributed when recording, to
        each request's `spans` (None: a decode step, one new position per row)."""
        record = self._record
        if record is not None:
            record.steps.clear()
        logits = self._logits(ids, attention, positions, keep, cache)
        if record is not None:
            (step,) = record.steps
            spans = spans or [(row, 0, 1) for row in range(len(reqs))]
            for req, (row, first, end) in zip(reqs, spans, strict=True):
                if req.routing is None:
                    req.routing = []
                req.routing.append(step[row, first:end].clone())
        return logits

    def _logits(
        self,
        ids: torch.Tensor,
        attention: torch.Tensor | None,
        positions: torch.Tensor | None,
        keep: torch.Tensor | None,
        cache: GrowingCache | None = None,
    ) -> torch.Tensor:
        """Each row's last-position logits [b, V]; with `keep` (one packed row), the logits at
        those positions [len(keep), V]."""
        extra = dict(self._forward_extra)
        if keep is not None and "logits_to_keep" in extra:
            extra["logits_to_keep"] = keep
        if cache is not None:
            extra.update(use_cache=True, **{self._cache_kwarg: cache})
        out = self._model(input_ids=ids, attention_mask=attention, position_ids=positions, **extra)
        if keep is None:
            return out.logits[:, -1, :]
        return out.logits[0] if "logits_to_keep" in extra else out.logits[0, keep]

    def _sample(self, logits: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
        params, generators = [r.params for r in reqs], [r.generator for r in reqs]
        tokens, chosen = draw(logits, params, generators, self._generator)
        version = self.version
        for req, tok, lp in zip(reqs, tokens.tolist(), chosen, strict=True):
            req.token_ids.append(int(tok))
            req.log_probs.append(float(lp))
            req.versions.append(version)
        return tokens


def _forward_kwargs(model: PreTrainedModel) -> tuple[str, dict[str, object]]:
    """Name of the forward's cache argument (`cache` in newer transformers, else
    `past_key_values`) and `logits_to_keep=1` where supported (only the last logits are used)."""
    names = inspect.signature(model.forward).parameters
    extra: dict[str, object] = {"logits_to_keep": 1} if "logits_to_keep" in names else {}
    return ("cache" if "cache" in names else "past_key_values"), extra
