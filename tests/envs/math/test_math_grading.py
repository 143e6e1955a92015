"""0/1 grading: normalised string match, the integer and fraction rules, then math-verify."""

from __future__ import annotations

import logging
import threading

import pytest

import envs.math.symbolic as symbolic
from envs.math import grade, ground_truth_text
from envs.math.normalize import (
    is_integer_literal,
    is_unreduced,
    normalize_answer,
    parse_fraction,
    parse_number,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("5\\text{cm}", "5"),
        ("18 dollars", "18"),
        ("\\$1,000.", "1000"),
        ("x = \\dfrac12", "\\frac{1}{2}"),
        ("\\pi r^2", "\\pi r^2"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        (".5", "0.5"),
        ("+3", "3"),
        ("10\\%", "10"),
        ("90^\\circ", "90"),
        ("\\text{\\textbf{Yes}}", "Yes"),
        ("\\sqrt2/2", "\\sqrt{2}/2"),
        ("2x", "2x"),
    ],
)
def test_normalize_answer(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


def test_numeric_literals_are_read_exactly() -> None:
    assert parse_number("2.50") == parse_number("2.5")
    assert parse_number("0.1") * 3 == parse_number("0.3")
    assert parse_number("1e5") is None and parse_number("3/4") is None
    assert is_integer_literal("7.0") and not is_integer_literal("7.5")
    assert parse_fraction("-\\frac{2}{4}") == (-2, 4)
    assert parse_fraction("(-2)/4") == (-2, 4)
    assert parse_fraction("1/0") is None
    assert is_unreduced((2, 4)) and is_unreduced((4, 2)) and not is_unreduced((1, 2))


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("so \\boxed{18}", "18", 1.0),
        ("\\boxed{18.0}", "18", 1.0),
        ("The answer is 18 dollars.", "18", 1.0),
        ("\\boxed{\\$1,000}", "1000", 1.0),
        ("\\boxed{1000}", "1,000", 1.0),
        ("\\boxed{17}", "18", 0.0),
        ("no answer here", "18", 0.0),
        ("\\boxed{Yes}", "yes", 1.0),
        ("\\boxed{0.50}", "0.5", 1.0),
        ("\\boxed{0.333}", "0.3333", 0.0),
        ("\\boxed{-3}", -3, 1.0),
        ("\\boxed{2.5}", 2.5, 1.0),
        ("\\boxed{\u22125}", "-5", 1.0),  # Unicode minus
        ("it is \u22125", "-5", 1.0),
        ("\\boxed{1{,}000}", "1000", 1.0),
        ("\\boxed{\\$18.00}", "18", 1.0),
        ("\\boxed{5}", "5.5", 0.0),
        ("\\boxed{y = 2x + 1}", "2x+1", 1.0),
    ],
)
def test_string_and_numeric_grading(response: str, truth: object, expected: float) -> None:
    assert grade(response, truth) == expected


@pytest.mark.parametrize(
    "response",
    [
        "\\boxed{17.9999999}",
        "\\boxed{18.0000001}",
        "\\boxed{36/2}",
        "\\boxed{\\frac{36}{2}}",
        "\\boxed{\\sqrt{324}}",
        "\\boxed{18+0}",
    ],
)
def test_integer_ground_truth_never_matches_a_non_integer_form(response: str) -> None:
    assert grade(response, "18") == 0.0


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("\\boxed{\\frac{2}{4}}", "2/4", 1.0),  # the same unreduced fraction, another spelling
        ("\\boxed{1/2}", "2/4", 0.0),  # an unreduced ground truth needs its exact form
        ("\\boxed{0.5}", "2/4", 0.0),
        ("\\boxed{2/4}", "1/2", 0.0),  # an unreduced answer does not match a reduced truth
        ("\\boxed{\\frac12}", "1/2", 1.0),
        ("\\boxed{-\\frac{3}{4}}", "\\frac{-3}{4}", 1.0),
    ],
)
def test_fraction_rules(response: str, truth: str, expected: float) -> None:
    assert grade(response, truth) == expected


def test_ground_truth_text_unwraps_gsm8k_and_boxes() -> None:
    assert ground_truth_text("She makes 9 * 2 = $18.\n#### 18") == "18"
    assert ground_truth_text("so the area is \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert ground_truth_text(7) == "7"
    assert grade("\\boxed{18}", "9 * 2 = 18\n#### 18") == 1.0


def test_bad_ground_truth_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="ground_truth"):
        grade("\\boxed{1}", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ground_truth"):
        grade("\\boxed{1}", True)
    with pytest.raises(ValueError, match="ground_truth is empty"):
        grade("\\boxed{1}", "  ")
    with pytest.raises(TypeError, match="response"):
        grade(None, "1")  # type: ignore[arg-type]


def test_without_math_verify_grading_falls_back_to_strings(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(symbolic, "math_verify_available", lambda: False)
    monkeypatch.setattr(symbolic, "_missing_warned", False)
    with caplog.at_level(logging.WARNING, logger="envs.math.symbolic"):
        assert grade("\\boxed{\\frac{1}{2}}", "0.5") == 0.0  # needs symbolic equivalence
        assert grade("\\boxed{\\frac12}", "\\frac{1}{2}") == 1.0  # string match still works
        assert grade("\\boxed{(x+1)^2}", "(x+1)^2") == 1.0
    warnings = [r for r in caplog.records if "math-verify is not installed" in r.getMessage()]
    assert len(warnings) == 1


# ---------------------------------------------------------------- symbolic (extra `math`)
SYMBOLIC_CASES = [
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    ("\\boxed{(x+1)^2}", "x^2+2x+2", 0.0),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", 1.0),
    ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}", 1.0),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
    ("\\boxed{\\sqrt{3}}", "\\sqrt{2}", 0.0),
    ("\\boxed{(1, 2)}", "(1,2)", 1.0),
    ("\\boxed{\\pi}", "3.14", 0.0),
    ("\\boxed{x \\in [1,2)}", "[1,2)", 1.0),
    ("\\boxed{\\frac{\\pi}{2}}", "\\pi/2", 1.0),
    ("\\boxed{\\infty}", "\\infty", 1.0),
]


@pytest.mark.parametrize(("response", "truth", "expected"), SYMBOLIC_CASES)
def test_symbolic_equivalence(response: str, truth: str, expected: float) -> None:
    pytest.importorskip("math_verify")
    assert grade(response, truth) == expected


def test_grading_from_rollout_threads_matches_the_main_thread() -> None:
    pytest.importorskip("math_verify")
    results: dict[int, float] = {}

    def work(i: int) -> None:
        response, truth, _ = SYMBOLIC_CASES[i]
        results[i] = grade(response, truth)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(SYMBOLIC_CASES))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: case[2] for i, case in enumerate(SYMBOLIC_CASES)}


PATHOLOGICAL = "\\boxed{\\int_0^1 e^{x^{7}}\\sin(x^{5})\\, dx}"


def test_pathological_answer_times_out_to_zero_from_a_thread() -> None:
    pytest.importorskip("math_verify")
    verifier = symbolic.default_verifier()
    before = verifier.timeouts
    out: list[float] = []
    thread = threading.Thread(target=lambda: out.append(grade(PATHOLOGICAL, "1/7", timeout_s=0.5)))
    thread.start()
    thread.join()
    assert out == [0.0]
    assert verifier.timeouts == before + 1  # the hard deadline fired, the worker was killed
    assert grade("\\boxed{0.5}", "\\frac{1}{2}") == 1.0  # a fresh worker takes over
