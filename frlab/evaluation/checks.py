"""What each evaluation kind asks of its resolved `eval` node beyond the declared types and
ranges, checked before the run starts and without loading a dataset (dry runs stay offline).

- `math` (AvgAtKEvaluation): every benchmark is a non-empty dataset source or a mapping with
  one, its hold-out split valid (envs.math.holdout, the loader's own rule); a template and an
  answer format the math env knows; `overlap_warnings` names a benchmark drawn from the
  training env's source without a disjoint hold-out (`holdout: {fraction: f, part: train}` for
  the env, `{fraction: f, part: heldout}` for the benchmark);
- `episodes` (EpisodeEvaluation): every benchmark is a mapping of training `env` keys to change.

Errors are ValueErrors whose text starts with the config key (the caller names it). Light on
purpose (no Lightning, no grader): preflight imports it where the classes would be too heavy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envs.math.extract import ANSWER_FORMATS
from envs.math.holdout import check_holdout
from envs.math.templates import MESSAGES, TEMPLATES
from frlab.errors import ConfigError
from frlab.registry import close_matches


def check_math(values: Mapping[str, Any], env: Mapping[str, Any]) -> list[str]:
    """ValueError for a bad math evaluation node; its overlap warnings otherwise."""
    for name, bench in values["benchmarks"].items():
        key = f"eval.benchmarks.{name}"
        if isinstance(bench, str) and not bench.strip():
            raise ConfigError(key, "must name a dataset source, got an empty string")
        if not isinstance(bench, str | Mapping):
            raise ConfigError(
                key, f"must be a dataset source or a mapping with `source`, got {bench!r}"
            )
        if isinstance(bench, Mapping):
            source = bench.get("source")
            if not isinstance(source, str) or not source.strip():
                raise ConfigError(
                    f"{key}.source", f"must be a non-empty dataset source, got {source!r}"
                )
            check_holdout(bench.get("holdout"), f"{key}.holdout")
    template, names = values["template"], (*TEMPLATES, MESSAGES)
    if template not in names and "{question}" not in template:
        raise ConfigError(
            "eval.template",
            f"must be one of {', '.join(names)} or a string "
            f"containing '{{question}}', got {template!r}",
        )
    if values["answer_format"] not in ANSWER_FORMATS:
        raise ConfigError(
            "eval.answer_format",
            f"must be one of {', '.join(ANSWER_FORMATS)}, got {values['answer_format']!r}",
        )
    return overlap_warnings(env, values["benchmarks"])


def check_episodes(values: Mapping[str, Any], env: Mapping[str, Any]) -> list[str]:
    """ValueError for a benchmark that is not a mapping of the training `env` node's keys."""
    env_keys = [str(k) for k in env if k != "_target_"]
    for name, bench in values["benchmarks"].items():
        key = f"eval.benchmarks.{name}"
        if bench is None:
            continue
        if not isinstance(bench, Mapping):
            raise ConfigError(key, f"must be a mapping of `env` keys to change, got {bench!r}")
        for field in bench:
            if field not in env_keys:
                hint = close_matches(str(field), env_keys)
                did = f"; did you mean {' or '.join(map(repr, hint))}?" if hint else ""
                raise ConfigError(
                    f"{key}.{field}",
                    f"is not a key of the training `env` node{did} "
                    f"(valid: {', '.join(sorted(env_keys))})",
                )
    return []


CHECKS = {"math": check_math, "episodes": check_episodes}


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


def describe(ev: Mapping[str, Any]) -> str:
    """A resolved `eval` node preflight passed, in one line of the plan:
    `KIND avg@K every N steps[ and at step 0] on A, B (T=t, top_p=p[, first L each])`."""
    from frlab.evaluation.benchmarks import benchmark_specs

    sampling = ev["sampling"]
    details = [f"T={float(sampling['temperature']):g}", f"top_p={float(sampling['top_p']):g}"]
    if ev.get("limit") is not None:
        details.append(f"first {ev['limit']} each")
    names = ", ".join(str(name) for name in benchmark_specs(ev["benchmarks"]))
    start = " and at step 0" if ev.get("at_start") else ""
    return (
        f"{ev['kind']} avg@{ev['k']} every {ev['every_n_steps']} steps{start} on {names} "
        f"({', '.join(details)})"
    )
