"""Prompts whose rollout the engine failed: run again from their start, never dropped for it.

A rollout fails for one of two kinds of reasons. The prompt's own: its environment raises or
passes its deadline, grading fails, the engine refuses the request itself (an HTTP 4xx), the
episode leaves no trajectory; such a rollout is dropped and counted as before. Or the engine's
(`is_engine_fault`): the request ended in `EngineFault` (a transport error, a dead, restarting
or unresponsive server, a 5xx, a weight push that did not reach the server, an answer refused
as malformed), or an engine request failed or passed its deadline while the engine reported an
outage or being down for good. Such a rollout says nothing about its prompt, so the prompt is
requeued: the same task, under the same prompt id, in its place in the data order (before
every prompt drawn after it), started again from the beginning (a multi-turn episode from its
first turn); a group (G > 1) is requeued whole. A prompt requeued `rollout.max_prompt_retries`
times is dropped at its next engine fault, counted as failed with reason
`engine_retries_exhausted` (a prompt that itself breaks the engine must not loop forever).
`RequeueCounts` is each prompt's count, part of the pool's checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from frlab.rollout.engine import Engine, EngineFault
from frlab.rollout.pool.rollouts import Failure

ENGINE_REASONS = frozenset({"engine", "engine_timeout"})  # the agent loop's engine failures
EXHAUSTED = "engine_retries_exhausted"


def is_engine_fault(failure: Failure, engine: Engine) -> bool:
    """Whether a failed rollout failed because of the engine (see the module docstring)."""
    _, reason, exc = failure
    if reason not in ENGINE_REASONS:
        return False
    if engine.outage() is not None or engine.down_reason() is not None:
        return True
    return any(isinstance(e, EngineFault) for e in causes(exc))


def causes(exc: BaseException | None, depth: int = 8) -> Iterable[BaseException]:
    """`exc` and the exceptions it was raised from (its `__cause__` chain, at most `depth`)."""
    for _ in range(depth):
        if exc is None:
            return
        yield exc
        exc = exc.__cause__


class RequeueCounts:
    """How often each prompt was requeued, until it is trained on or dropped."""

    def __init__(self, max_retries: int) -> None:
        if int(max_retries) < 0:
            raise ValueError(f"max_prompt_retries must be >= 0, got {max_retries}")
        self.max_retries = int(max_retries)
        self.counts: dict[int, int] = {}

    def take(self, prompt_id: int) -> bool:
        """Count one more requeue of `prompt_id`; False (and forgotten) once it had its
        `max_retries`."""
        done = self.counts.get(int(prompt_id), 0)
        if done >= self.max_retries:
            self.forget(prompt_id)
            return False
        self.counts[int(prompt_id)] = done + 1
        return True

    def forget(self, prompt_id: int) -> None:
        """The prompt was trained on or dropped for a reason of its own."""
        self.counts.pop(int(prompt_id), None)

    def records(self) -> list[list[int]]:
        """Checkpoint form: [prompt id, requeues] pairs (plain values; JSON keeps them)."""
        return [[p, n] for p, n in sorted(self.counts.items())]

    def restore(self, records: Any) -> None:
        """Inverse of `records` (a checkpoint without them: no prompt requeued)."""
        self.counts = {int(p): int(n) for p, n in (records or [])}
