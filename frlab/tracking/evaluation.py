"""`AvgAtKEvaluation`: avg@k accuracy per benchmark, measured during training every N steps.

The FlashREINFORCE paper reports avg@k (mean over problems of the fraction of k sampled
replies graded correct; avg@32 on AIME at temperature 0.6) as its evaluation metric.
This callback measures it on the running rollout engine (the trainer's datamodule -> pool ->
engine, which always holds the learner's latest weights), every `every_n_steps` optimizer
steps and, with `at_start=True` (the reference implementation's evaluation before training),
once at step 0 when a run starts from scratch (not on resume). It reports
`eval/<benchmark>/avg@k` and `eval/mean/avg@k` for that step only: to every
`RunFilesCallback` (`log_step_metrics`, or `log_start_metrics` for the step-0 row of
metrics.csv) and to the trainer's loggers (`log_metrics(step=...)`). Not through `pl_module.log`: Lightning keeps such a value
and would repeat it in every later step's row. List this callback BEFORE `RunFilesCallback`
in the trainer's callbacks (frlab.train does, from the `eval` config group) so the values land
in the same step's row.

Evaluation sampling involves no importance sampling, so `top_p < 1` is allowed here even when
training refuses it; the `SamplingParams` go straight to the engine, all requests of one call
submitted together (`engine.generate_many`), each with a seed derived from the engine's weight
version, the call number and the request index (frlab.rollout.seeding), so an evaluation in a
synchronous run is as reproducible as its training. Prompts are the
chat template applied to the benchmark template (`template_ids`), replies are decoded without
special tokens and graded by `envs.math.evaluate_avg_at_k`. Only global rank 0 evaluates.
The schedule and the publishing live in `PeriodicEvaluation`, shared with
`frlab.tracking.episode_evaluation.EpisodeEvaluation` (whole agent episodes, ALFWorld).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from lightning.pytorch.callbacks import Callback

from frlab.rollout.agent_loop import DEFAULT_ENGINE_TIMEOUT_S, template_ids
from frlab.rollout.engine import SamplingParams
from frlab.rollout.seeding import derive_seed

T = TypeVar("T")
EVAL_SEED_SALT = 0x45564C  # evaluation seeds never coincide with a training rollout's
Problems = Sequence[Mapping[str, Any]]
BenchmarkSpec = str | Mapping[str, Any] | Problems


def load_benchmark(name: str, spec: BenchmarkSpec, limit: int | None) -> list[dict[str, Any]]:
    """Problems of one benchmark: a dataset source string, a mapping of `load_math_dataset`
    keyword arguments (with `source`), or an in-memory sequence of {question, answer} dicts."""
    if isinstance(spec, str):
        from envs.math.datasets import load_math_dataset

        return list(load_math_dataset(spec, limit=limit))
    if isinstance(spec, Mapping):
        if "source" not in spec:
            raise ValueError(f"benchmarks.{name} needs a 'source' key (got {sorted(spec)})")
        from envs.math.datasets import load_math_dataset

        kwargs = dict(spec)
        kwargs.setdefault("limit", limit)
        return list(load_math_dataset(kwargs.pop("source"), **kwargs))
    if isinstance(spec, Sequence):
        problems = [dict(p) for p in spec]
        return problems[:limit] if limit is not None else problems
    raise ValueError(
        f"benchmarks.{name} must be a dataset source, a mapping or a list of problems, "
        f"got {type(spec).__name__}"
    )


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
    when it is running, else on a fresh event loop in a worker thread; wait for its result."""
    if loop is not None and loop.is_running() and not loop.is_closed():
        return asyncio.run_coroutine_threadsafe(make(), loop).result()
    with concurrent.futures.ThreadPoolExecutor(1) as worker:
        return worker.submit(lambda: asyncio.run(make())).result()


def publish(trainer: Any, step: int, metrics: Mapping[str, float]) -> None:
    """Hand one step's metrics to the run files (metrics.csv row) and to every logger; step 0
    (before training) goes to `log_start_metrics`, its own row."""
    hook = "log_start_metrics" if step == 0 else "log_step_metrics"
    for callback in getattr(trainer, "callbacks", None) or ():
        log_metrics = getattr(callback, hook, None)
        if callable(log_metrics):
            log_metrics(metrics)
    for logger in getattr(trainer, "loggers", None) or ():
        logger.log_metrics(dict(metrics), step=step)


def positive_int(name: str, value: Any, who: str = "AvgAtKEvaluation") -> int:
    """`value` if it is an integer >= 1, else a ValueError naming `who.name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{who}.{name} must be an integer >= 1, got {value!r}")
    return value


class PeriodicEvaluation(Callback):
    """Runs `evaluate_pool(pool) -> metrics` every `every_n_steps` optimizer steps (once per
    step, global rank 0 only) and, with `at_start`, at step 0 of a fresh run; publishes the
    metrics for that step."""

    def __init__(self, every_n_steps: int, who: str, at_start: bool = False) -> None:
        self.every_n_steps = positive_int("every_n_steps", every_n_steps, who)
        if not isinstance(at_start, bool):
            raise ValueError(f"{who}.at_start must be true or false, got {at_start!r}")
        self.who, self.at_start = who, at_start
        self._last_step = -1
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
        step = int(trainer.global_step)
        if self.due(step):
            self._run(trainer, step)

    def _run(self, trainer: Any, step: int) -> None:
        self._last_step = step
        if not trainer.is_global_zero:
            return
        metrics = self.evaluate_pool(find_pool(trainer, self.who))
        self.history.append((step, metrics))
        publish(trainer, step, metrics)


def engine_version(engine: Any) -> int:
    """The engine's weight version (0 for an engine that reports none)."""
    return int(getattr(engine, "version", 0))


class EngineGenerate:
    """`generate(prompts) -> replies` over an async engine: one sampled reply per chat prompt.

    Runs on `loop` (the pool's event loop, where the engine lives) when it is running, else on
    a fresh event loop in a worker thread. Each request has a deadline (`timeout_s`); one past
    it fails the evaluation with a TimeoutError instead of hanging the run."""

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        params: SamplingParams,
        loop: asyncio.AbstractEventLoop | None = None,
        timeout_s: float = DEFAULT_ENGINE_TIMEOUT_S,
    ) -> None:
        self.engine, self.tokenizer, self.params, self.loop = engine, tokenizer, params, loop
        self.timeout_s = float(timeout_s)
        self.calls = 0

    async def _generate_all(self, prompt_ids: list[list[int]]) -> list[Any]:
        """Every prompt with its own seed (version, call, index), submitted together; the
        whole set under the engine deadline."""
        self.calls += 1
        base = derive_seed(EVAL_SEED_SALT, engine_version(self.engine), self.calls)
        requests = [
            (ids, dataclasses.replace(self.params, seed=derive_seed(base, i)))
            for i, ids in enumerate(prompt_ids)
        ]
        many = getattr(self.engine, "generate_many", None)  # every frlab Engine has it
        pending = [self.engine.generate(*r) for r in requests] if many is None else many(requests)
        try:
            return await asyncio.wait_for(asyncio.gather(*pending), self.timeout_s)
        except TimeoutError as exc:
            raise TimeoutError(
                f"evaluation engine request did not return within {self.timeout_s:g} s"
            ) from exc

    def __call__(self, prompts: list[list[dict[str, str]]]) -> list[str]:
        prompt_ids = [template_ids(self.tokenizer, messages) for messages in prompts]
        results = run_on_loop(self.loop, lambda: self._generate_all(prompt_ids))
        return [self.tokenizer.decode(r.token_ids, skip_special_tokens=True) for r in results]


class AvgAtKEvaluation(PeriodicEvaluation):
    """Logs avg@k per benchmark (and their mean) every `every_n_steps` optimizer steps."""

    def __init__(
        self,
        benchmarks: Mapping[str, BenchmarkSpec],
        k: int,
        every_n_steps: int,
        *,
        temperature: float = 0.6,
        top_p: float = 1.0,
        max_new_tokens: int = 1024,
        template: str = "instruct",
        limit: int | None = None,
        timeout_s: float = 5.0,
        max_workers: int = 4,
        prefix: str = "eval",
        at_start: bool = False,
    ) -> None:
        if not isinstance(benchmarks, Mapping) or not benchmarks:
            raise ValueError("AvgAtKEvaluation.benchmarks must be a non-empty mapping name -> spec")
        super().__init__(every_n_steps, "AvgAtKEvaluation", at_start)
        self.k = positive_int("k", k)
        self.limit = None if limit is None else positive_int("limit", limit)
        self.max_new_tokens = positive_int("max_new_tokens", max_new_tokens)
        self.sampling = SamplingParams(
            temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens
        )
        self.sampling.validate(off_policy_correction=False)
        self.benchmark_specs = dict(benchmarks)
        self.template, self.timeout_s, self.max_workers = template, timeout_s, max_workers
        self.prefix = prefix
        self._benchmarks: dict[str, list[dict[str, Any]]] | None = None

    @classmethod
    def from_config(
        cls, *, benchmarks: Mapping[str, BenchmarkSpec], sampling: Mapping[str, Any], **kw: Any
    ) -> AvgAtKEvaluation:
        """From an `eval` node of kind math (frlab.config.schema_eval.MathEvalConfig)."""
        return cls(benchmarks, **kw, **sampling)

    @property
    def benchmarks(self) -> dict[str, list[dict[str, Any]]]:
        """The loaded problems per benchmark (loaded once, on first use)."""
        if self._benchmarks is None:
            self._benchmarks = {
                name: load_benchmark(name, spec, self.limit)
                for name, spec in self.benchmark_specs.items()
            }
        return self._benchmarks

    def params_for(self, tokenizer: Any) -> SamplingParams:
        """Evaluation sampling params, stopping at the tokenizer's eos (end of the reply)."""
        eos = getattr(tokenizer, "eos_token_id", None)
        stop = () if eos is None else (int(eos),)
        return SamplingParams(
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            max_new_tokens=self.max_new_tokens,
            stop_token_ids=stop,
        )

    def evaluate(self, engine: Any, tokenizer: Any, loop: Any = None) -> dict[str, float]:
        """avg@k metrics of every benchmark on `engine` (no logging)."""
        from envs.math.evaluate import evaluate_avg_at_k

        generate = EngineGenerate(engine, tokenizer, self.params_for(tokenizer), loop)
        return evaluate_avg_at_k(
            generate,
            self.benchmarks,
            self.k,
            template=self.template,
            timeout_s=self.timeout_s,
            max_workers=self.max_workers,
            prefix=self.prefix,
        )

    def evaluate_pool(self, pool: Any) -> dict[str, float]:
        return self.evaluate(pool.engine, pool.tokenizer, getattr(pool, "_loop", None))
