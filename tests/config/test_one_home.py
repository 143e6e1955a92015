"""Each setting has one home: its declaration in frlab.config.schema. Code built from a
declaration takes the key without a default of its own, so no second default can drift from
the declared one (the values come checked from the config, or, for a Python caller, from the
declaration's defaults)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from frlab.config import schema
from frlab.config.compose import locate
from frlab.config.declare import meta_of


def own_targets() -> Iterator[tuple[type, Callable[..., Any]]]:
    """(declaration, the frlab or envs callable its `_target_` names)."""
    declarations = [*schema.SECTIONS.values(), *schema.ENGINES.values(), *schema.EVALS.values()]
    for cls in declarations:
        target = getattr(cls, "_target_", None)
        if isinstance(target, str) and target.startswith(("frlab.", "envs.")):
            yield cls, locate(target)


def keys_of(cls: type, *, args_only: bool = True) -> set[str]:
    return {
        f.name
        for f in dataclasses.fields(cls)
        if not f.name.startswith("_") and (meta_of(f).arg or not args_only)
    }


def defaulted(func: Callable[..., Any], keys: set[str]) -> list[str]:
    params = inspect.signature(func).parameters
    return sorted(
        k for k in keys if k in params and params[k].default is not inspect.Parameter.empty
    )


def built_from_declarations() -> list[tuple[str, Callable[..., Any], set[str]]]:
    """frlab's own code that takes declared keys besides the `_target_`s."""
    from frlab.evaluation.avg_at_k import AvgAtKEvaluation, EngineGenerate
    from frlab.evaluation.episodes import EpisodeEvaluation
    from frlab.evaluation.periodic import PeriodicEvaluation
    from frlab.learner.optim import CosineFactor, build_scheduler
    from frlab.learner.settings import LearnerSettings
    from frlab.rollout.agent_loop import AgentLoopConfig
    from frlab.rollout.callbacks import WeightSyncCallback
    from frlab.rollout.engine import SamplingParams
    from frlab.rollout.pool.pool import RolloutPool
    from frlab.rollout.remote.engine import RemoteEngine
    from frlab.rollout.torch.engine import TorchEngine
    from frlab.rollout.torch.process import ProcessTorchEngine
    from frlab.rollout.vllm.engine import VLLMEngine

    rollout = {
        "mode",
        "samples_per_prompt",
        "max_in_flight",
        "max_policy_lag",
        "max_prompt_retries",
    }
    episode = {"max_turns", "max_len", "sampling", "env_timeout_s", "engine_timeout_s"}
    deadlines = {"adaptive_deadlines", "env_timeout_floor_s", "engine_timeout_floor_s"}
    vllm = {"max_in_flight", "cpu_kv_cache_gib", "weight_update", "seed"}
    sampling = keys_of(schema.EvalSamplingConfig)
    return [
        ("RemoteEngine", RemoteEngine.__init__, keys_of(schema.RemoteConfig) | {"seed"}),
        ("TorchEngine", TorchEngine.__init__, keys_of(schema.TorchEngineConfig) | {"seed"}),
        (
            "ProcessTorchEngine",
            ProcessTorchEngine.__init__,
            keys_of(schema.TorchProcessEngineConfig) | {"seed"},
        ),
        ("VLLMEngine", VLLMEngine.__init__, vllm),
        ("SamplingParams", SamplingParams, keys_of(schema.SamplingConfig)),
        ("AgentLoopConfig", AgentLoopConfig, episode | deadlines),
        ("AvgAtKEvaluation", AvgAtKEvaluation.__init__, keys_of(schema.MathEvalConfig) | sampling),
        (
            "EpisodeEvaluation",
            EpisodeEvaluation.__init__,
            keys_of(schema.EpisodesEvalConfig) | sampling,
        ),
        ("EngineGenerate", EngineGenerate.__init__, {"timeout_s", "system_prompt"}),
        ("PeriodicEvaluation", PeriodicEvaluation.__init__, {"every_n_steps", "at_start"}),
        ("WeightSyncCallback", WeightSyncCallback.__init__, {"sync_every"}),
        ("CosineFactor", CosineFactor, {"min_lr_ratio"}),
        ("RolloutPool", RolloutPool.__init__, rollout | {"seed"}),
        ("LearnerSettings", LearnerSettings, {f.name for f in dataclasses.fields(LearnerSettings)}),
        ("build_scheduler", build_scheduler, {"scheduler", "warmup_ratio", "min_lr_ratio"}),
    ]


@pytest.mark.parametrize("declaration", [c for c, _ in own_targets()], ids=lambda c: c.__name__)
def test_a_target_takes_its_declared_keys_without_defaults(declaration: type) -> None:
    target = dict(own_targets())[declaration]
    assert defaulted(target, keys_of(declaration)) == [], target


def test_frlab_code_fed_from_declarations_has_no_second_default() -> None:
    found = {name: defaulted(func, keys) for name, func, keys in built_from_declarations()}
    assert {name: keys for name, keys in found.items() if keys} == {}


def test_the_check_finds_a_second_default() -> None:
    def with_default(*, lr: float = 1e-3, eps: float) -> None: ...

    assert defaulted(with_default, {"lr", "eps"}) == ["lr"]
