"""How new weights meet the requests in flight (`rollout.weight_update`; the three modes and
how an engine resolves the one it runs are in frlab.rollout.engine): the steps of a mode that
more than one backend takes, written once here:

- resubmit: `continue_after_abort` sends a request that an update stopped again, as prompt +
  its tokens with the rest of its budget, until it ends (the in-process vLLM engine, and the
  remote engine on vLLM servers);
- in_flight: `span_versions` reads one weight version per token from contiguous labelled
  spans (vLLM's `weight_versions`, in-process and over HTTP);
- drain: `wait_drained` waits, with a deadline, until no request is decoding (the torch
  engine's serving thread, and its child process).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

from frlab.rollout.engine import SEED_LIMIT, EngineError, GenerationResult, SamplingParams

DRAIN_DEADLINE_S = 600.0  # longest wait of a drain update for the running requests


# -- resubmit ---------------------------------------------------------------------------------
@dataclasses.dataclass
class Fragment:
    """What one submission of a request sampled: ids, their log-probs and weight versions, and
    why it ended: "stop", "length", or "abort" (a resubmit update stopped it)."""

    token_ids: list[int]
    log_probs: list[float]
    versions: list[int]
    finish_reason: str


Submit = Callable[[list[int], SamplingParams], Awaitable[Fragment]]


async def continue_after_abort(
    submit: Submit,
    prompt: list[int],
    params: SamplingParams,
    on_abort: Callable[[], object] | None = None,
) -> GenerationResult:
    """`submit(prompt, params)`; after each fragment a resubmit update aborted, submit prompt +
    the tokens so far with the rest of the budget (`rest_params`), until a fragment ends on its
    own. An aborted fragment whose last token is a stop token ends the request as "stop", one
    that spent the budget as "length": neither is sent again. `submit` raises for an abort no
    update asked for; `on_abort` is called once per aborted fragment."""
    tokens: list[int] = []
    log_probs: list[float] = []
    versions: list[int] = []
    while True:
        part = await submit(prompt + tokens, rest_params(params, len(tokens)))
        tokens += part.token_ids
        log_probs += part.log_probs
        versions += part.versions
        if part.finish_reason != "abort":
            return GenerationResult(tokens, log_probs, versions, part.finish_reason)
        if on_abort is not None:
            on_abort()
        if tokens and tokens[-1] in params.stop_token_ids:
            return GenerationResult(tokens, log_probs, versions, "stop")
        if len(tokens) >= params.max_new_tokens:
            return GenerationResult(tokens, log_probs, versions, "length")


def rest_params(params: SamplingParams, done: int) -> SamplingParams:
    """The sampling of a continuation after `done` tokens: the rest of the budget, and a
    request's own seed moved on by `done` (so the continuation does not replay the first
    draws; None stays None)."""
    if not done:
        return params
    seed = None if params.seed is None else (int(params.seed) + done) % SEED_LIMIT
    return dataclasses.replace(params, max_new_tokens=params.max_new_tokens - done, seed=seed)


# -- in_flight --------------------------------------------------------------------------------
def span_versions(spans: Any, n: int, fields: Callable[[Any], tuple[Any, Any, Any]]) -> list[int]:
    """One int version per token of `n` output tokens from contiguous spans, each read as
    `fields(span)` = (label, start, end) over tokens `[start, end)`, labelled with frlab's
    version as a decimal string. ValueError when tokens are unlabelled (`spans` None with
    tokens), a label is not such a version, or the spans leave a gap, overlap or miss a token;
    `fields` may raise KeyError / AttributeError / TypeError for a span without those fields."""
    if spans is None:
        if n:
            raise ValueError("no token is labelled with a weight version")
        return []
    if not isinstance(spans, list | tuple):
        raise ValueError(f"weight-version spans must be a list, got {spans!r:.200}")
    out: list[int] = []
    for span in spans:
        label, start, end = fields(span)
        if not isinstance(label, str) or not (label.isascii() and label.isdigit()):
            raise ValueError(f"weight version label {label!r} is not frlab's version")
        if not (_is_int(start) and _is_int(end)) or start != len(out) or end < start:
            raise ValueError(f"weight-version spans do not tile the output: {spans!r:.200}")
        out += [int(label)] * (end - start)
    if len(out) != n:
        raise ValueError(f"weight-version spans cover {len(out)} of {n} tokens")
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# -- drain ------------------------------------------------------------------------------------
def wait_drained(
    running: Callable[[], int],
    wait: Callable[[float], object],
    *,
    deadline_s: float = DRAIN_DEADLINE_S,
    down: Callable[[], str | None] = lambda: None,
) -> None:
    """Return once `running()` (the requests decoding; negative: not reported yet) is 0;
    `wait(s)` blocks at most s seconds between two looks (a condition's wait, or a sleep).
    EngineError naming `down()` when it reports the decoding worker gone, and past
    `deadline_s` (the weights stay as they were: the caller reopens admission)."""
    deadline = time.monotonic() + deadline_s
    while (count := running()) != 0:
        reason = down()
        if reason is not None:
            raise EngineError(f"update_weights (drain): {reason}")
        left = deadline - time.monotonic()
        if left <= 0:
            still = f"{count} requests" if count > 0 else "requests"
            raise EngineError(
                f"update_weights (drain): {still} still decoding after {deadline_s:.0f} s"
            )
        wait(left)
