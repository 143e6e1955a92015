"""`EpisodeEvaluation`: avg@k of multi-turn environments (ALFWorld seen / unseen games).

The paper evaluates ALFWorld on 140 seen and 134 unseen games with 3 samples each (temperature
1.0, top_p 0.7, every 40 updates and before training). Every `every_n_steps` optimizer steps
(and at step 0 with `at_start`) this callback plays every task of each benchmark
environment k times with the agent loop (`run_episode`, the training loop's turn protocol and
token handling) on the running rollout engine, which holds the learner's latest weights. It
reports, for that step only (see `PeriodicEvaluation`):

- `eval/<benchmark>/avg@k`: mean over tasks of the mean reward of the task's k episodes (the
  win rate for ALFWorld's 0/1 reward), and `eval/mean/avg@k` over benchmarks;
- `eval/<benchmark>/errors`: episodes that failed (environment or engine error, scored 0).

Tasks come from one environment instance: `games()` (ALFWorld, one `{"game_file"}` task per
game folder, sorted) or a `tasks` list (the Python-tool env). Each episode gets a fresh
environment from the benchmark's factory and closes it. At most `concurrency` episodes run at
once, on the pool's event loop. Each episode samples with a seed derived from the engine's
weight version, the benchmark, the task and the sample number (frlab.rollout.seeding);
environment calls and engine requests have the training deadlines (`env_timeout_s`,
`engine_timeout_s`): a hung episode counts as an error. Episodes run in the pool's pinned
background thread (the learner goes on; see `PeriodicEvaluation`). Only global rank 0
evaluates.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any, cast

from frlab.evaluation.periodic import (
    EVAL_SEED_SALT,
    PeriodicEvaluation,
    engine_version,
    positive_int,
    run_on_loop,
)
from frlab.rollout.agent_loop import (
    AgentLoopConfig,
    RolloutError,
    env_call,
    run_episode,
)
from frlab.rollout.engine import SamplingParams
from frlab.rollout.seeding import derive_seed

WHO = "EpisodeEvaluation"


def list_tasks(env: Any, name: str, limit: int | None) -> list[dict[str, Any]]:
    """The evaluation tasks of benchmark `name`'s environment, in a fixed order."""
    games = getattr(env, "games", None)
    if callable(games):
        tasks = [{"game_file": str(path)} for path in games()]
    elif isinstance(getattr(env, "tasks", None), list):
        tasks = [dict(task) for task in env.tasks]
    else:
        raise ValueError(
            f"benchmarks.{name}: {type(env).__name__} cannot list its tasks (needs `games()` "
            "or a `tasks` list)"
        )
    if not tasks:
        raise ValueError(f"benchmarks.{name}: the environment has no tasks")
    return tasks[:limit] if limit is not None else tasks


def _close(env: Any) -> None:
    close = getattr(env, "close", None)
    if callable(close):
        close()


class EpisodeEvaluation(PeriodicEvaluation):
    """Logs avg@k per benchmark environment (and their mean) every `every_n_steps` steps."""

    def __init__(
        self,
        benchmarks: Mapping[str, Callable[[], Any]],
        k: int,
        every_n_steps: int,
        *,
        max_turns: int,
        max_len: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        limit: int | None,
        concurrency: int,
        env_timeout_s: float,
        engine_timeout_s: float,
        at_start: bool,
        prefix: str = "eval",
    ) -> None:
        if not isinstance(benchmarks, Mapping) or not benchmarks:
            raise ValueError(f"{WHO}.benchmarks must be a non-empty mapping name -> env factory")
        super().__init__(every_n_steps, WHO, at_start)
        self.factories = dict(benchmarks)
        self.k = positive_int("k", k, WHO)
        self.limit = None if limit is None else positive_int("limit", limit, WHO)
        self.concurrency = positive_int("concurrency", concurrency, WHO)
        sampling = SamplingParams(
            temperature=temperature, top_p=top_p, top_k=0, max_new_tokens=max_new_tokens
        )
        sampling.validate(off_policy_correction=False)
        # evaluation episodes run under fixed deadlines: the two timeouts, never adapted
        self.loop_cfg = AgentLoopConfig(
            max_turns=max_turns,
            max_len=max_len,
            sampling=sampling,
            env_timeout_s=env_timeout_s,
            engine_timeout_s=engine_timeout_s,
            adaptive_deadlines=False,
            env_timeout_floor_s=env_timeout_s,
            engine_timeout_floor_s=engine_timeout_s,
        )
        self.prefix = prefix
        self._tasks: dict[str, list[dict[str, Any]]] = {}

    @classmethod
    def from_config(
        cls,
        *,
        benchmarks: Mapping[str, Mapping[str, Any] | None],
        sampling: Mapping[str, Any],
        env: Mapping[str, Any],
        env_factory: Callable[..., Callable[[], Any]] | None = None,
        **kw: Any,
    ) -> EpisodeEvaluation:
        """From an `eval` node of kind episodes (frlab.config.schema.EpisodesEvalConfig; its own
        rules: frlab.evaluation.checks): one environment factory per benchmark, the `env` node
        with the benchmark's keys changed."""
        from omegaconf import OmegaConf

        from frlab.evaluation.benchmarks import benchmark_specs

        if env_factory is None:
            raise ValueError("EpisodeEvaluation.from_config needs the run's env_factory")
        if OmegaConf.is_config(benchmarks):
            benchmarks = cast(dict, OmegaConf.to_container(benchmarks, resolve=True))
        factories = {
            name: env_factory(OmegaConf.merge(env, changes or {}))
            for name, changes in benchmark_specs(benchmarks).items()
        }
        return cls(factories, **kw, **sampling)

    def tasks(self, name: str) -> list[dict[str, Any]]:
        """Benchmark `name`'s tasks (listed once, on first use)."""
        if name not in self._tasks:
            env = self.factories[name]()
            try:
                self._tasks[name] = list_tasks(env, name, self.limit)
            finally:
                _close(env)
        return self._tasks[name]

    async def _episode(
        self,
        engine: Any,
        tokenizer: Any,
        name: str,
        index: int,
        sample: int,
        sem: asyncio.Semaphore,
    ) -> float | None:
        """The reward of sample `sample` of task `index` of `name`; None when it failed."""
        task = self.tasks(name)[index]
        bench = list(self.factories).index(name)
        seed = derive_seed(EVAL_SEED_SALT, engine_version(engine), bench, index, sample)
        async with sem:
            env = self.factories[name]()
            try:
                traj = await run_episode(
                    engine, env, task, tokenizer, self.loop_cfg, prompt_id=index, seed=seed
                )
                return float(traj.reward)
            except RolloutError:
                return None
            finally:
                with contextlib.suppress(RolloutError):  # a hung close is abandoned
                    await env_call(None, self.loop_cfg.env_timeout_s, "env_close", _close, env)

    async def _play_all(self, engine: Any, tokenizer: Any) -> dict[str, list[float | None]]:
        sem = asyncio.Semaphore(self.concurrency)
        jobs = {
            name: [
                self._episode(engine, tokenizer, name, i, j, sem)
                for i in range(len(self.tasks(name)))
                for j in range(self.k)
            ]
            for name in self.factories
        }
        return {name: list(await asyncio.gather(*coros)) for name, coros in jobs.items()}

    def evaluate(self, engine: Any, tokenizer: Any, loop: Any = None) -> dict[str, float]:
        """avg@k and error counts of every benchmark on `engine` (no logging)."""
        for name in self.factories:
            self.tasks(name)  # list tasks here, off the engine's event loop
        rewards = run_on_loop(loop, lambda: self._play_all(engine, tokenizer))
        metrics: dict[str, float] = {}
        for name, values in rewards.items():
            scores = [0.0 if v is None else v for v in values]
            metrics[f"{self.prefix}/{name}/avg@{self.k}"] = sum(scores) / len(scores)
            metrics[f"{self.prefix}/{name}/errors"] = float(sum(v is None for v in values))
        means = [metrics[f"{self.prefix}/{name}/avg@{self.k}"] for name in rewards]
        metrics[f"{self.prefix}/mean/avg@{self.k}"] = sum(means) / len(means)
        return metrics

    def evaluate_pool(self, pool: Any) -> dict[str, float]:
        return self.evaluate(pool.engine, pool.tokenizer, getattr(pool, "loop", None))
