"""One request's state inside the torch engine, and how a request leaves the running batch.

`Request` collects what the sampler records per token (ids, log-probs, weight versions, MoE
routing) and resolves its concurrent future once: with a result at a stop token or the token
budget, with an EngineError when the caller abandoned it or the engine failed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from frlab.rollout.engine import EngineError, GenerationResult, SamplingParams

if TYPE_CHECKING:
    from frlab.rollout.torch.kv_batch import DecodeRows


@dataclass(eq=False)
class Request:
    """A queued or decoding request: its prompt, sampling settings and what was sampled so far."""

    prompt: list[int]
    params: SamplingParams
    future: concurrent.futures.Future
    generator: torch.Generator | None = None
    abandoned: bool = False  # the caller stopped waiting: drop the row at the next step
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    routing: list[torch.Tensor] | None = None  # per-forward [t, L, k] pieces when recording

    @property
    def context(self) -> list[int]:
        """What a prefill feeds: the prompt, then the tokens sampled so far (after a resubmit)."""
        return self.prompt + self.token_ids if self.token_ids else self.prompt

    def finish(self, reason: str) -> None:
        routing = None
        if self.routing is not None:
            with torch.inference_mode(False):  # a plain tensor the learner may index with
                routing = torch.cat(self.routing, dim=0)
        settle(
            self.future,
            GenerationResult(self.token_ids, self.log_probs, self.versions, reason, routing),
        )


def drop_finished(rows: DecodeRows, reqs: list[Request]) -> tuple[DecodeRows | None, list[Request]]:
    """Resolve the rows that just finished and remove them (and abandoned ones) from `rows`."""
    keep = [i for i, req in enumerate(reqs) if not finished(req)]
    if not keep:
        return None, []
    if len(keep) < len(reqs):
        rows.select(keep)
    return rows, [reqs[i] for i in keep]


def finished(req: Request) -> bool:
    """Resolve `req` if it just sampled a stop token or used its budget; True also when its
    caller abandoned it."""
    if req.token_ids[-1] in req.params.stop_token_ids:
        req.finish("stop")
        return True
    if len(req.token_ids) >= req.params.max_new_tokens:
        req.finish("length")
        return True
    if req.abandoned:
        fail(req, EngineError("request abandoned by its caller"))
        return True
    return False


def awaitable(req: Request) -> asyncio.Future[GenerationResult]:
    """An asyncio future of `req` on the running loop; cancelling it abandons the request."""
    future = asyncio.wrap_future(req.future)

    def on_done(f: asyncio.Future[GenerationResult]) -> None:
        if f.cancelled():
            req.abandoned = True

    future.add_done_callback(on_done)
    return future


def fail(req: Request, exc: Exception) -> None:
    """Fail `req` with `exc` unless it is already resolved (or its caller cancelled it)."""
    settle(req.future, exc)


def settle(future: concurrent.futures.Future, outcome: object) -> None:
    """Resolve `future` with a result or an exception, unless it was cancelled or settled first."""
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except concurrent.futures.InvalidStateError:
        pass  # cancelled (or settled) meanwhile: nobody waits for it
