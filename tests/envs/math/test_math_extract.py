"""Answer extraction: last balanced box, then a final-answer phrase, then the last number."""

from __future__ import annotations

import pytest

from envs.math import extract_answer, grade
from envs.math.extract import after_final_phrase, is_prose, last_boxed, last_number


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
        ("**Final answer:** 12 apples\nThanks 99", "12"),  # prose: its last number
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


def test_the_answer_after_a_phrase_is_read_from_the_rest_of_its_line() -> None:
    """The rule implemented for the final-answer phrase, and why.

    The FlashREINFORCE reference launches its math runs on Molt's grader
    (NVIDIA-NeMo/labs-molt, examples/python/utils/math_grader.py): after the last box it
    takes the rest of the line after an answer phrase (up to a newline, `<` or `|`) as the
    answer. Taken whole, "still 4 + 1 which is 5." never matches 5 (it scored 0 here before).
    frlab keeps the reference's order (box, phrase, last number) and its line rule, then
    reads that rest of the line: a box in it wins, then its first `$...$` span (Minerva's
    "The final answer is $5$. I hope it is correct."); a line of prose (a word that is not a
    LaTeX command or a math word) gives its LAST number, the value the sentence ends on;
    anything else is the answer as written (`x = 4`, `2 pi`, `sqrt(2)/2`). No single rule
    reads every sentence: one that states the answer first and explains after ("is 5 because
    2 + 3") reads 3; prompts that ask for a box or a bare number avoid the question.
    """
    assert extract_answer("The final answer is still 4 + 1 which is 5.") == "5"
    assert grade("The final answer is still 4 + 1 which is 5.", "5") == 1.0
    minerva = "Final Answer: The final answer is $\\frac{3}{4}$. I hope it is correct."
    assert extract_answer(minerva) == "\\frac{3}{4}"
    assert extract_answer("the answer is 2 pi") == "2 pi"
    assert extract_answer("The answer is sqrt(2)/2") == "sqrt(2)/2"
    assert extract_answer("The answer is 12, because 3 * 4 = 12.") == "12"
    assert extract_answer("The answer is 7 <|im_end|> 9") == "7"  # the line ends at `<`
    assert is_prose("still 4 + 1 which is 5") and not is_prose("2\\sqrt{3} + \\pi")


def test_the_last_number_reads_a_latex_fraction_whole() -> None:
    assert last_number("so it is \\frac{3}{4}") == "\\frac{3}{4}"
    assert extract_answer("so it is \\frac{3}{4}") == "\\frac{3}{4}"


@pytest.mark.parametrize(
    ("response", "boxed", "final_line"),
    [
        ("4 + 1 = \\boxed{5}", "5", "5"),
        ("5", None, "5"),
        ("**5**", None, "5"),
        ("$5$.", None, "5"),
        ("The answer is 5.", None, "5"),
        ("4 + 1 = 5\nSo the answer is 5", None, "5"),
        # Truncated or wordy replies: the default's last-number fallback would read 5 or 4.
        ("Step 1: 4 + 1 = 5\nStep 2: we", None, None),
        ("To calculate 4 + 1, we add 4", None, None),
        ("The answer is 5.\nStep 3: add 5", None, None),  # the last line states nothing
        ("\\boxed{3}\nthen 5", "3", None),
        ("", None, None),
    ],
)
def test_strict_formats_refuse_chance_matches(
    response: str, boxed: str | None, final_line: str | None
) -> None:
    assert extract_answer(response, "boxed") == boxed
    assert extract_answer(response, "final_line") == final_line
    for fmt, expected in (("boxed", boxed), ("final_line", final_line)):
        assert grade(response, "5", answer_format=fmt) == float(expected == "5")


def test_strict_format_turns_a_chance_match_into_zero() -> None:
    truncated = "Calculate 2 + 3.\nStep 1: 2 + 3 = 5. Step 2: 5"  # cut off at 16 tokens
    assert grade(truncated, "5") == 1.0  # the last number happens to be right
    assert grade(truncated, "5", answer_format="final_line") == 0.0
    assert grade(truncated, "5", answer_format="boxed") == 0.0


def test_unknown_answer_format_names_the_choices() -> None:
    with pytest.raises(ValueError, match="any, boxed, final_line"):
        extract_answer("5", "strict")
