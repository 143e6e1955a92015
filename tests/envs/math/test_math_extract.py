"""Answer extraction: last balanced box, then a final-answer phrase, then the last number."""

from __future__ import annotations

import pytest

from envs.math import extract_answer
from envs.math.extract import after_final_phrase, last_boxed, last_number


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("so \\boxed{18}.", "18"),
        ("first \\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\frac{\\sqrt{3}}{\\sqrt{2}}}", "\\frac{\\sqrt{3}}{\\sqrt{2}}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces do not close the box
        ("\\fbox{7}", "7"),
        ("\\boxed 5 is it", "5"),
        ("$\\boxed{ 42 }$", "42"),
    ],
)
def test_boxed_content(response: str, expected: str) -> None:
    assert extract_answer(response) == expected


def test_unbalanced_last_box_falls_back_to_the_previous_balanced_box() -> None:
    text = "draft \\boxed{3} ... final \\boxed{\\frac{1}{2"  # truncated generation
    assert last_boxed(text) == "3"
    assert extract_answer(text) == "3"


def test_boxed_command_prefix_is_not_a_box() -> None:
    assert last_boxed("\\boxedx{3}") is None


def test_box_wins_over_phrase_and_numbers() -> None:
    assert extract_answer("The answer is 5. Actually \\boxed{6} and 7") == "6"


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("blah 3 + 4\nThe answer is 7.", "7"),
        ("Final Answer: $\\frac{3}{4}$", "\\frac{3}{4}"),
        ("**Final answer:** 12 apples\nThanks 99", "12 apples"),
        ("work\n#### 1,234", "1,234"),
        ("the final answer is \\boxed{9} ok", "9"),
        ("Answer: x = 4", "x = 4"),
        ("the answer is 2\nsomething\nthe answer is 3", "3"),
    ],
)
def test_final_answer_phrase(response: str, expected: str) -> None:
    assert extract_answer(response) == expected


def test_empty_phrase_falls_through_to_last_number() -> None:
    assert after_final_phrase("The answer is\n") is None
    assert extract_answer("we get 12 then 13. The answer is\n") == "13"


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("3 apples and 4 pears make 7", "7"),
        ("it costs -1,234.5 dollars", "-1,234.5"),
        ("about 3 / 4 of it", "3/4"),
        ("value .5", ".5"),
    ],
)
def test_last_number(response: str, expected: str) -> None:
    assert last_number(response) == expected
    assert extract_answer(response) == expected


def test_no_answer_is_none() -> None:
    assert extract_answer("I do not know.") is None
    assert extract_answer("") is None


def test_non_string_response_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="response"):
        extract_answer(5)  # type: ignore[arg-type]
