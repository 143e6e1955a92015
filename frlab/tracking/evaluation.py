"""`AvgAtKEvaluation`: avg@k accuracy per benchmark, measured during training every N steps.

The FlashREINFORCE paper reports avg@k (mean over problems of the fraction of k sampled
replies graded correct; avg@32 on AIME at temperature 0.6) as its evaluation metric (SPEC §4).
This callback measures it on the running rollout engine (the trainer's datamodule -> pool ->
engine, which always holds the learner's latest weights), every `every_n_steps` optimizer
steps (never at step 0), and logs `eval/<benchmark>/avg@k` and `eval/mean/avg@k` with
`pl_module.log`, so `RunFilesCallback` writes them to metrics.csv. List it BEFORE
`RunFilesCallback` in the trainer's callbacks so the values land in the same step's row.

Evaluation sampling involves no importance sampling, so `top_p < 1` is allowed here even when
training refuses it; the `SamplingParams` go straight to `engine.generate`. Prompts are the
chat template applied to the benchmark template (`template_ids`), replies are decoded without
special tokens and graded by `envs.math.evaluate_avg_at_k`. Only global rank 0 evaluates.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Mapping, Sequence
from typing import Any

from lightning.pytorch.callbacks import Callback

from frlab.rollout.agent_loop import template_ids
from frlab.rollout.engine import SamplingParams

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


def find_pool(trainer: Any) -> Any:
    """The rollout pool of the trainer's datamodule; a clear error when there is none."""
    pool = getattr(getattr(trainer, "datamodule", None), "pool", None)
    if pool is None or getattr(pool, "engine", None) is None:
        raise RuntimeError(
            "AvgAtKEvaluation needs a running rollout pool (trainer.datamodule.pool.engine)"
        )
    return pool


def forget_logged(trainer: Any, names: set[str]) -> None:
    """Remove `names` from the trainer's step metrics. Lightning keeps a value logged once in
    its result collection and metric dicts until the epoch ends, so a metric logged every N
    steps would otherwise reappear in every later row (Lightning internals, used defensively)."""
    results = getattr(trainer, "_results", None)
    for item in (results or {}).values():
        if getattr(getattr(item, "meta", None), "name", None) in names:
            item.reset()
    for attr in ("callback_metrics", "logged_metrics", "progress_bar_metrics"):
        store = getattr(trainer, attr, None)
        if isinstance(store, dict):
            for name in names:
                store.pop(name, None)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"AvgAtKEvaluation.{name} must be an integer >= 1, got {value!r}")
    return value


class EngineGenerate:
    """`generate(prompts) -> replies` over an async engine: one sampled reply per chat prompt.

    Runs on `loop` (the pool's event loop, where the engine lives) when it is running, else on
    a fresh event loop in a worker thread."""

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        params: SamplingParams,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.engine, self.tokenizer, self.params, self.loop = engine, tokenizer, params, loop

    async def _generate_all(self, prompt_ids: list[list[int]]) -> list[Any]:
        return await asyncio.gather(*(self.engine.generate(ids, self.params) for ids in prompt_ids))

    def __call__(self, prompts: list[list[dict[str, str]]]) -> list[str]:
        prompt_ids = [template_ids(self.tokenizer, messages) for messages in prompts]
        loop = self.loop
        if loop is not None and loop.is_running() and not loop.is_closed():
            results = asyncio.run_coroutine_threadsafe(
                self._generate_all(prompt_ids), loop
            ).result()
        else:
            with concurrent.futures.ThreadPoolExecutor(1) as worker:
                results = worker.submit(asyncio.run, self._generate_all(prompt_ids)).result()
        return [self.tokenizer.decode(r.token_ids, skip_special_tokens=True) for r in results]


class AvgAtKEvaluation(Callback):
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
    ) -> None:
        if not isinstance(benchmarks, Mapping) or not benchmarks:
            raise ValueError("AvgAtKEvaluation.benchmarks must be a non-empty mapping name -> spec")
        self.k = _positive_int("k", k)
        self.every_n_steps = _positive_int("every_n_steps", every_n_steps)
        self.limit = None if limit is None else _positive_int("limit", limit)
        self.max_new_tokens = _positive_int("max_new_tokens", max_new_tokens)
        self.sampling = SamplingParams(
            temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens
        )
        self.sampling.validate(off_policy_correction=False)
        self.benchmark_specs = dict(benchmarks)
        self.template, self.timeout_s, self.max_workers = template, timeout_s, max_workers
        self.prefix = prefix
        self._benchmarks: dict[str, list[dict[str, Any]]] | None = None
        self._last_step = -1
        self._logged: set[str] = set()
        self.history: list[tuple[int, dict[str, float]]] = []

    @property
    def benchmarks(self) -> dict[str, list[dict[str, Any]]]:
        """The loaded problems per benchmark (loaded once, on first use)."""
        if self._benchmarks is None:
            self._benchmarks = {
                name: load_benchmark(name, spec, self.limit)
                for name, spec in self.benchmark_specs.items()
            }
        return self._benchmarks

    def due(self, step: int) -> bool:
        """Whether optimizer step `step` is an evaluation step (N, 2N, ...; never 0, once each)."""
        return step > 0 and step % self.every_n_steps == 0 and step != self._last_step

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

    def on_train_batch_start(self, trainer: Any, pl_module: Any, *_: Any) -> None:
        """Drop the last evaluation's values, so later steps do not repeat them (metrics.csv)."""
        if self._logged:
            forget_logged(trainer, self._logged)
            self._logged = set()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *_: Any) -> None:
        step = int(trainer.global_step)
        if not self.due(step):
            return
        self._last_step = step
        if not trainer.is_global_zero:
            return
        pool = find_pool(trainer)
        metrics = self.evaluate(pool.engine, pool.tokenizer, getattr(pool, "_loop", None))
        self.history.append((step, metrics))
        for name, value in metrics.items():
            pl_module.log(name, value, on_step=True, on_epoch=False, rank_zero_only=True)
        self._logged = set(metrics)
