"""`AvgAtKEvaluation`: avg@k accuracy per benchmark, measured during training every N steps.

The FlashREINFORCE paper reports avg@k (mean over problems of the fraction of k sampled
replies graded correct; avg@32 on AIME at temperature 0.6) as its evaluation metric.
This callback measures it on the running rollout engine (the trainer's datamodule -> pool ->
engine, which always holds the learner's latest weights), every `every_n_steps` optimizer
steps and, with `at_start` (the reference implementation's evaluation before training),
once at step 0 when a run starts from scratch (not on resume). It reports
`eval/<benchmark>/avg@k`, its standard error `eval/<benchmark>/avg@k_se` and
`eval/mean/avg@k` for that step only: to every `RunFilesCallback` (`log_step_metrics(...,
step=)`, that step's metrics.csv row, step 0 a row of its own) and to the trainer's loggers
(`log_metrics(step=...)`). Not through `pl_module.log`: Lightning keeps such a value and would
repeat it in every later step's row.

The learner does not stop for it where the pool allows: the evaluation runs in the pool's
pinned background thread (`RolloutPool.run_pinned`), its requests share the engine with the
training rollouts, and only the next weight push waits until it has finished (so it measures
exactly the weights of its step). Its metrics are published when it finishes (at the latest
at the end of training). A pool without `run_pinned` is evaluated synchronously.

Evaluation sampling involves no importance sampling, so `top_p < 1` is allowed here even when
training refuses it; the `SamplingParams` go straight to the engine, all requests of one call
submitted together (`engine.generate_many`) under the engine deadline, each with a seed
derived from the engine's weight version, the call number and the request index
(frlab.rollout.seeding), so an evaluation in a synchronous run is as reproducible as its
training. Prompts are the chat template applied to the benchmark template (`template_ids`,
with the `system_prompt` setting of the training env), replies are decoded without special
tokens and graded by `envs.math.evaluate_avg_at_k` in `answer_format`. `limit` caps every
benchmark at its first N problems, also one that sets its own `limit`. A benchmark list
(`[source, {name, source, ...}]`) names its entries by `name` or by the source
(`benchmark_specs`). Only global rank 0 evaluates.
The schedule and the publishing live in `frlab.evaluation.periodic.PeriodicEvaluation`, shared
with `frlab.evaluation.episodes.EpisodeEvaluation` (whole agent episodes, ALFWorld).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from omegaconf import OmegaConf

from frlab.evaluation.benchmarks import BenchmarkSpec, benchmark_specs, load_benchmark
from frlab.evaluation.periodic import (
    EVAL_SEED_SALT,
    PeriodicEvaluation,
    engine_version,
    positive_int,
    run_on_loop,
)
from frlab.rollout.chat import template_ids
from frlab.rollout.engine import SamplingParams
from frlab.rollout.seeding import derive_seed

log = logging.getLogger(__name__)
# env node -> a zero-argument factory of fresh environments; the caller passes the one its
# rollout pool uses (frlab.rollout.pool.factory.env_factory).
EnvFactory = Callable[..., Callable[[], Any]]


def _plain(node: Any) -> Any:
    """A config node as plain containers (anything else as is)."""
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def env_questions(env: Mapping[str, Any], env_factory: EnvFactory) -> set[str]:
    """The questions of the training environment built from its `env` node by `env_factory`
    (the one the pool uses); empty when its tasks are not a dataset."""
    from frlab.rollout.pool.rollouts import close_env

    made = env_factory(OmegaConf.create(dict(env)))()
    try:
        return {str(task.get("question", "")).strip() for task in getattr(made, "dataset", ())}
    finally:
        close_env(made)


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
        loop: asyncio.AbstractEventLoop | None,
        *,
        timeout_s: float,
        system_prompt: str,
    ) -> None:
        self.engine, self.tokenizer, self.params, self.loop = engine, tokenizer, params, loop
        self.timeout_s = float(timeout_s)
        self.system_prompt = system_prompt
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
        prompt_ids = [
            template_ids(self.tokenizer, messages, self.system_prompt) for messages in prompts
        ]
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
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        template: str,
        limit: int | None,
        timeout_s: float,
        max_workers: int,
        at_start: bool,
        answer_format: str,
        system_prompt: str,
        engine_timeout_s: float,
        prefix: str = "eval",
        training_questions: Callable[[], set[str]] | None = None,
    ) -> None:
        if isinstance(benchmarks, Sequence) and not isinstance(benchmarks, str):
            benchmarks = benchmark_specs(benchmarks)
        if not isinstance(benchmarks, Mapping) or not benchmarks:
            raise ValueError("AvgAtKEvaluation.benchmarks must be a non-empty mapping name -> spec")
        super().__init__(every_n_steps, "AvgAtKEvaluation", at_start)
        self.k = positive_int("k", k)
        self.limit = None if limit is None else positive_int("limit", limit)
        self.sampling = SamplingParams(
            temperature=temperature,
            top_p=top_p,
            top_k=0,
            max_new_tokens=positive_int("max_new_tokens", max_new_tokens),
        )
        self.sampling.validate(off_policy_correction=False)
        self.benchmark_specs = dict(benchmarks)
        self.template, self.timeout_s, self.max_workers = template, timeout_s, max_workers
        self.engine_timeout_s = float(engine_timeout_s)
        self.prefix, self.answer_format, self.system_prompt = prefix, answer_format, system_prompt
        self.training_questions = training_questions
        self.overlap: dict[str, int] = {}
        self._benchmarks: dict[str, list[dict[str, Any]]] | None = None

    @classmethod
    def from_config(
        cls,
        *,
        benchmarks: Mapping[str, BenchmarkSpec],
        sampling: Mapping[str, Any],
        env: Mapping[str, Any] | None,
        env_factory: EnvFactory | None = None,
        **kw: Any,
    ) -> AvgAtKEvaluation:
        """From an `eval` node of kind math (frlab.config.schema.MathEvalConfig; its own rules:
        frlab.evaluation.checks); with the training `env` node, benchmark questions that
        training also sees are counted."""
        benchmarks, sampling, env = _plain(benchmarks), _plain(sampling), _plain(env)
        questions = None
        if isinstance(env, Mapping) and "source" in env and env_factory is not None:
            questions = functools.partial(env_questions, env, env_factory)
        return cls(benchmarks, **kw, **sampling, training_questions=questions)

    @property
    def benchmarks(self) -> dict[str, list[dict[str, Any]]]:
        """The loaded problems per benchmark (loaded once, on first use)."""
        if self._benchmarks is None:
            self._benchmarks = {
                name: load_benchmark(name, spec, self.limit)
                for name, spec in self.benchmark_specs.items()
            }
            self._check_overlap(self._benchmarks)
        return self._benchmarks

    def _check_overlap(self, benchmarks: Mapping[str, list[dict[str, Any]]]) -> None:
        """Count (and warn about) benchmark questions that the training set also holds."""
        if self.training_questions is None:
            return
        seen = self.training_questions()
        for name, problems in benchmarks.items():
            shared = sum(str(p["question"]).strip() in seen for p in problems)
            self.overlap[name] = shared
            if shared:
                log.warning(
                    "evaluation benchmark %r shares %d of its %d questions with the training "
                    "set: its score measures recall of trained problems, not generalisation "
                    "(hold problems out with holdout={fraction, part})",
                    name,
                    shared,
                    len(problems),
                )

    def params_for(self, tokenizer: Any) -> SamplingParams:
        """Evaluation sampling params, stopping at the tokenizer's eos (end of the reply)."""
        eos = getattr(tokenizer, "eos_token_id", None)
        stop = () if eos is None else (int(eos),)
        return dataclasses.replace(self.sampling, stop_token_ids=stop)

    def evaluate(self, engine: Any, tokenizer: Any, loop: Any = None) -> dict[str, float]:
        """avg@k metrics of every benchmark on `engine` (no logging)."""
        from envs.math.evaluate import evaluate_avg_at_k

        params = self.params_for(tokenizer)
        generate = EngineGenerate(
            engine,
            tokenizer,
            params,
            loop,
            timeout_s=self.engine_timeout_s,
            system_prompt=self.system_prompt,
        )
        return evaluate_avg_at_k(
            generate,
            self.benchmarks,
            self.k,
            template=self.template,
            timeout_s=self.timeout_s,
            max_workers=self.max_workers,
            prefix=self.prefix,
            answer_format=self.answer_format,
        )

    def evaluate_pool(self, pool: Any) -> dict[str, float]:
        return self.evaluate(pool.engine, pool.tokenizer, getattr(pool, "loop", None))
