"""Parsing a Python-tool turn: Qwen XML tool calls, fenced blocks, committed answers, grading."""

from __future__ import annotations

import json

import pytest

from envs.python_tool.grading import fallback_grade, normalise
from envs.python_tool.parsing import ToolCall, committed_answer, last_boxed, parse_tool_call


def xml_call(code: str, name: str = "python") -> str:
    payload = json.dumps({"name": name, "arguments": {"code": code}})
    return f"Let me compute.\n<tool_call>\n{payload}\n</tool_call>"


def test_qwen_xml_call() -> None:
    assert parse_tool_call(xml_call("print(1 + 1)\nprint('}')")) == ToolCall(
        "print(1 + 1)\nprint('}')"
    )


def test_arguments_as_json_string() -> None:
    payload = json.dumps({"name": "python", "arguments": json.dumps({"code": "print(3)"})})
    assert parse_tool_call(f"<tool_call>{payload}</tool_call>") == ToolCall("print(3)")


def test_fenced_python_block() -> None:
    text = "Compute it:\n```python\nx = 2\nprint(x ** 10)\n```\nthen see."
    assert parse_tool_call(text) == ToolCall("x = 2\nprint(x ** 10)\n")


def test_xml_call_wins_over_fence_and_first_call_is_used() -> None:
    text = "```python\nprint('fence')\n```\n" + xml_call("print('a')") + xml_call("print('b')")
    assert parse_tool_call(text) == ToolCall("print('a')")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ("<tool_call>[1, 2]</tool_call>", "JSON object"),
        (xml_call("print(1)", name="bash"), "unknown tool 'bash'"),
        ('<tool_call>{"name": "python", "arguments": {"src": "x"}}</tool_call>', '{"code"'),
    ],
)
def test_malformed_calls_give_an_error(text: str, error: str) -> None:
    call = parse_tool_call(text)
    assert call is not None and call.code is None and error in (call.error or "")


def test_no_call() -> None:
    assert parse_tool_call("I think the answer is 4. ```\nplain fence\n```") is None


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("so <answer> 42 </answer>", "42"),
        ("<answer>1</answer> no wait <answer>2</answer>", "2"),
        ("The result is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{x^{2}}", "x^{2}"),
        ("```python\nprint('\\\\boxed{7}')\n```", None),
        (xml_call("print('<answer>5</answer>')"), None),
        ("no answer here: 12", None),
        ("unbalanced \\boxed{3", None),
    ],
)
def test_committed_answer(text: str, answer: str | None) -> None:
    assert committed_answer(text) == answer


def test_last_boxed_balanced() -> None:
    assert last_boxed("\\boxed{a{b}c} and \\fbox{d}") == "d"
    assert last_boxed("nothing") is None


@pytest.mark.parametrize(
    ("answer", "truth", "reward"),
    [
        ("42", "42", 1.0),
        ("$42$", "42", 1.0),
        ("1,000", "1000", 1.0),
        ("42.0", "42", 1.0),
        ("42.5", "42", 0.0),
        ("\\text{Yes}", "yes", 1.0),
        ("\\dfrac{1}{2}", "\\frac{1}{2}", 1.0),
        ("\\frac{2}{4}", "\\frac{1}{2}", 0.0),
        ("41", "42", 0.0),
    ],
)
def test_fallback_grade(answer: str, truth: str, reward: float) -> None:
    assert fallback_grade(answer, truth) == reward


def test_normalise() -> None:
    assert normalise(" $\\left( 1, 2 \\right)$. ") == "(1,2)"
