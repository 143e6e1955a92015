"""Preflight for the optional `eval` node (avg@k during training, configs/eval/*.yaml).

`eval: null` (eval=none, the default) turns evaluation off. Otherwise the node is checked
against its declaration (frlab.config.schema_eval, chosen by `eval.kind`: `math` or
`episodes`) without loading a dataset (dry runs stay offline): types and ranges (`eval.k
must be >= 1`), unknown keys, the benchmark specs (math: a dataset source string or a mapping
of `MathBenchmarkConfig` keys; episodes: a mapping of keys of the training `env` node to
change), the prompt template (one the math env knows), and two cross-field rules: an
evaluation interval that the run reaches (`eval.every_n_steps <= trainer.max_steps`) and a
generation budget that leaves room for the prompt (`eval.sampling.max_new_tokens <
rollout.max_len`). Errors are `ConfigError`s naming the key.

`eval.benchmarks` is a named mapping or a list (frlab.evaluation.benchmarks: a list is replaced
by one override); it is turned into the mapping before the declaration check.

A benchmark drawn from the training env's source overlaps the training problems unless both
hold out complementary parts (`holdout: {fraction: f, part: train}` for the env and
`{fraction: f, part: heldout}` for the benchmark; envs.math.holdout): preflight logs a warning
naming it (`overlap_warnings`). Overlaps between different sources are counted when the
evaluation loads its problems (frlab.evaluation.avg_at_k).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from frlab.config.declare import check_node
from frlab.config.errors import ConfigError, unknown
from frlab.config.schema_eval import EVALS, KINDS, MathBenchmarkConfig
from frlab.evaluation.benchmarks import benchmark_specs

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
    for name, spec in values["benchmarks"].items():
        if kind == "math":
            _check_benchmark(f"eval.benchmarks.{name}", spec)
        else:
            _check_env_benchmark(f"eval.benchmarks.{name}", spec, env_keys)
    if kind == "math":
        _check_template(values["template"])
        env = OmegaConf.to_container(cfg.env, resolve=True) if cfg.get("env") else {}
        for message in overlap_warnings(env, values["benchmarks"]):  # type: ignore[arg-type]
            log.warning(message)
    _check_cross(values, rollout, trainer)
    return values


def _holdout(spec: Any) -> tuple[float, str] | None:
    holdout = spec.get("holdout") if isinstance(spec, Mapping) else None
    if not isinstance(holdout, Mapping):
        return None
    return holdout.get("fraction"), holdout.get("part")


def overlap_warnings(env: Mapping[str, Any], benchmarks: Mapping[str, Any]) -> list[str]:
    """Warnings for benchmarks drawn from the training env's source without complementary
    hold-out parts (same fraction, `train` for the env and `heldout` for the benchmark)."""
    source, env_part = env.get("source"), _holdout(env)
    out = []
    for name, spec in benchmarks.items():
        bench_source = spec.get("source") if isinstance(spec, Mapping) else spec
        if source is None or bench_source != source:
            continue
        part = _holdout(spec)
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


def _check_benchmark(key: str, spec: Any) -> None:
    """A math benchmark: a dataset source, or a `MathBenchmarkConfig` mapping."""
    if isinstance(spec, str):
        if not spec.strip():
            raise ConfigError(key, "must name a dataset source, got an empty string")
        return
    if not isinstance(spec, Mapping):
        raise ConfigError(key, f"must be a dataset source or a mapping with `source`, got {spec!r}")
    check_node(key, spec, MathBenchmarkConfig)
    source = spec.get("source")
    if not isinstance(source, str) or not source.strip():
        raise ConfigError(f"{key}.source", f"must be a non-empty dataset source, got {source!r}")


def _check_env_benchmark(key: str, spec: Any, env_keys: list[str]) -> None:
    """An episodes benchmark: a mapping of training-env keys to change (may be empty)."""
    if spec is None:
        return
    if not isinstance(spec, Mapping):
        raise ConfigError(key, f"must be a mapping of `env` keys to change, got {spec!r}")
    for field in spec:
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
