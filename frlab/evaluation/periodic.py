"""`PeriodicEvaluation`: the schedule and publishing shared by every evaluation callback.

An evaluation runs every `every_n_steps` optimizer steps (and at step 0 with `at_start`, when a
run starts from scratch, not on resume), in the rollout pool's pinned background thread where
the pool has one (`RolloutPool.run_pinned`: the learner goes on, only the next weight push
waits, so it measures exactly the weights of its step), else synchronously. Its metrics are
published for that step only, to every `RunFilesCallback` and to the trainer's loggers, when
it finishes (at the latest at the end of training). Only global rank 0 evaluates.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

from lightning.pytorch.callbacks import Callback

T = TypeVar("T")
EVAL_SEED_SALT = 0x45564C  # evaluation seeds never coincide with a training rollout's


def find_pool(trainer: Any, who: str = "AvgAtKEvaluation") -> Any:
    """The rollout pool of the trainer's datamodule; a clear error when there is none."""
    pool = getattr(getattr(trainer, "datamodule", None), "pool", None)
    if pool is None or getattr(pool, "engine", None) is None:
        raise RuntimeError(f"{who} needs a running rollout pool (trainer.datamodule.pool.engine)")
    return pool


def run_on_loop(
    loop: asyncio.AbstractEventLoop | None, make: Callable[[], Coroutine[Any, Any, T]]
) -> T:
    """Run the coroutine `make()` on `loop` (the pool's event loop, where the engine lives)
    when it is running, else on a fresh event loop in a worker thread; wait for its result
    (RuntimeError if the pool's loop stops first: it would never answer)."""
    if loop is not None and loop.is_running() and not loop.is_closed():
        future = asyncio.run_coroutine_threadsafe(make(), loop)
        while True:
            try:
                return future.result(timeout=1.0)
            except concurrent.futures.TimeoutError:
                if loop.is_closed() or not loop.is_running():
                    future.cancel()
                    raise RuntimeError("the rollout pool stopped during the evaluation") from None
    with concurrent.futures.ThreadPoolExecutor(1) as worker:
        return worker.submit(lambda: asyncio.run(make())).result()


def publish(trainer: Any, step: int, metrics: Mapping[str, float]) -> None:
    """Hand one step's metrics to the run files (that step's metrics.csv row, written late if
    need be; step 0, before training, a row of its own) and to every logger."""
    for callback in getattr(trainer, "callbacks", None) or ():
        log_step_metrics = getattr(callback, "log_step_metrics", None)
        if callable(log_step_metrics):
            log_step_metrics(metrics, step=step)
    for logger in getattr(trainer, "loggers", None) or ():
        logger.log_metrics(dict(metrics), step=step)


def positive_int(name: str, value: Any, who: str = "AvgAtKEvaluation") -> int:
    """`value` if it is an integer >= 1, else a ValueError naming `who.name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{who}.{name} must be an integer >= 1, got {value!r}")
    return value


class PeriodicEvaluation(Callback):
    """Runs `evaluate_pool(pool) -> metrics` every `every_n_steps` optimizer steps (and at
    step 0 with `at_start`; once per step, global rank 0 only), in the pool's pinned
    background thread when it has one, and publishes the metrics for that step."""

    def __init__(self, every_n_steps: int, who: str, at_start: bool) -> None:
        self.every_n_steps = positive_int("every_n_steps", every_n_steps, who)
        if not isinstance(at_start, bool):
            raise ValueError(f"{who}.at_start must be true or false, got {at_start!r}")
        self.who, self.at_start = who, at_start
        self._last_step = -1
        self._pending: tuple[int, concurrent.futures.Future] | None = None
        self.history: list[tuple[int, dict[str, float]]] = []

    def due(self, step: int) -> bool:
        """Whether optimizer step `step` is a periodic evaluation step (N, 2N, ...; once each)."""
        return step > 0 and step % self.every_n_steps == 0 and step != self._last_step

    def evaluate_pool(self, pool: Any) -> dict[str, float]:
        """The metrics of one evaluation on the running rollout pool's engine."""
        raise NotImplementedError

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """The step-0 evaluation (`at_start`), before the first update of a fresh run."""
        if self.at_start and int(trainer.global_step) == 0 and self._last_step < 0:
            self._run(trainer, 0)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *_: Any) -> None:
        self._collect(trainer, wait=False)
        step = int(trainer.global_step)
        if self.due(step):
            self._run(trainer, step)

    def _run(self, trainer: Any, step: int) -> None:
        self._last_step = step
        if trainer.is_global_zero:
            self._start(trainer, step)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._collect(trainer, wait=True)

    def _start(self, trainer: Any, step: int) -> None:
        """Start one evaluation of the current weights (after the previous one finished)."""
        self._collect(trainer, wait=True)
        pool = find_pool(trainer, self.who)
        run_pinned = getattr(pool, "run_pinned", None)
        if callable(run_pinned):
            future = run_pinned(self.evaluate_pool, pool)
        else:
            future = concurrent.futures.Future()
            future.set_result(self.evaluate_pool(pool))
        self._pending = (step, future)

    def _collect(self, trainer: Any, wait: bool) -> None:
        """Publish a finished evaluation (with `wait`, wait for it first; its errors raise)."""
        if self._pending is None or (not wait and not self._pending[1].done()):
            return
        (step, future), self._pending = self._pending, None
        metrics = future.result()
        self.history.append((step, metrics))
        publish(trainer, step, metrics)


def engine_version(engine: Any) -> int:
    """The engine's weight version (0 for an engine that reports none)."""
    return int(getattr(engine, "version", 0))
