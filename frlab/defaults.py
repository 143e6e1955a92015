"""Runtime objects as a Python caller (a bench, a notebook, a test) builds them: every setting
left out takes its declared default (frlab.config.arguments.declared_arguments /
declared_defaults; the declarations are frlab.config.schema's), so that no caller holds a second
copy of a default and the constructors need none.

`sampling_params`, `agent_loop_config`, `torch_engine`, `process_engine`, `make_vllm_engine`,
`avg_at_k` and `episode_evaluation` take the keys they change as keywords; `seed` defaults to
the root's declared `seed`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from frlab.config.arguments import declared_arguments, declared_defaults
from frlab.config.schema import (
    EpisodesEvalConfig,
    EvalSamplingConfig,
    FrlabConfig,
    MathEvalConfig,
    RolloutConfig,
    SamplingConfig,
    TorchEngineConfig,
    TorchProcessEngineConfig,
    VLLMEngineConfig,
)
from frlab.rollout.agent_loop import AgentLoopConfig
from frlab.rollout.engine import SamplingParams

NOT_DECLARED = ("seed", "initial_version")  # constructor arguments that are no engine key


def sampling_params(**changes: Any) -> SamplingParams:
    """`rollout.sampling`'s declared defaults with `changes` (and `stop_token_ids`, `seed`)."""
    extra = {k: changes.pop(k) for k in ("stop_token_ids", "seed") if k in changes}
    return SamplingParams(**declared_arguments(SamplingConfig, **changes), **extra)


def agent_loop_config(**changes: Any) -> AgentLoopConfig:
    """The episode limits at `rollout`'s declared defaults with `changes` (`sampling` a
    SamplingParams or a mapping of sampling keys)."""
    names = [f.name for f in dataclasses.fields(AgentLoopConfig) if f.init]
    sampling = changes.pop("sampling", None)
    if not isinstance(sampling, SamplingParams):
        sampling = sampling_params(**(sampling or {}))
    rollout = declared_defaults(RolloutConfig, [n for n in names if n != "sampling"])
    return AgentLoopConfig(**{**rollout, **changes, "sampling": sampling})


def engine_arguments(declaration: type, changes: Mapping[str, Any]) -> dict[str, Any]:
    """An engine constructor's keywords: the declaration's keys with `changes`, and `seed`."""
    run = {k: v for k, v in changes.items() if k in NOT_DECLARED}
    keys = {k: v for k, v in changes.items() if k not in NOT_DECLARED}
    return {"seed": FrlabConfig.seed, **run, **declared_arguments(declaration, **keys)}


def torch_engine(model: Any, **changes: Any) -> Any:
    from frlab.rollout.torch.engine import TorchEngine

    return TorchEngine(model, **engine_arguments(TorchEngineConfig, changes))


def process_engine(model: Any, **changes: Any) -> Any:
    from frlab.rollout.torch.process import ProcessTorchEngine

    return ProcessTorchEngine(model, **engine_arguments(TorchProcessEngineConfig, changes))


def make_vllm_engine(model: str, **changes: Any) -> Any:
    """A `VLLMEngine` of the folder `model`: the engine keys its constructor names at their
    declared defaults; every other change (`max_model_len`, `dtype`, ...) goes to vLLM as is."""
    from frlab.rollout.vllm.engine import VLLMEngine

    named = ("max_in_flight", "cpu_kv_cache_gib", "weight_update")
    declared = declared_arguments(VLLMEngineConfig, model=None)
    keys = {k: changes.pop(k, declared[k]) for k in named}
    return VLLMEngine(model, **{"seed": FrlabConfig.seed, **keys, **changes})


def eval_arguments(declaration: type, changes: dict[str, Any]) -> dict[str, Any]:
    """An evaluation's keywords: its declared sampling and keys (those that follow `rollout`
    take rollout's declared defaults) with `changes`; the node-only keys left out."""
    names = [f.name for f in dataclasses.fields(EvalSamplingConfig)]
    sampling = declared_defaults(
        EvalSamplingConfig, **{k: changes.pop(k) for k in names if k in changes}
    )
    skip = {"benchmarks", "k", "every_n_steps", "sampling", "env", "kind"}
    keys = [f.name for f in dataclasses.fields(declaration) if f.name not in skip]
    given = {k: changes.pop(k) for k in list(changes) if k in keys}
    return {**declared_defaults(declaration, keys, **given), **sampling, **changes}


def avg_at_k(benchmarks: Any, k: int, every_n_steps: int, **changes: Any) -> Any:
    from frlab.evaluation.avg_at_k import AvgAtKEvaluation

    return AvgAtKEvaluation(benchmarks, k, every_n_steps, **eval_arguments(MathEvalConfig, changes))


def episode_evaluation(benchmarks: Any, k: int, every_n_steps: int, **changes: Any) -> Any:
    from frlab.evaluation.episodes import EpisodeEvaluation

    arguments = eval_arguments(EpisodesEvalConfig, changes)
    return EpisodeEvaluation(benchmarks, k, every_n_steps, **arguments)
