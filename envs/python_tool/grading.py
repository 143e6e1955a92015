"""Grade the committed answer of a Python-tool episode 0/1.

Uses `envs.math.grade(response, ground_truth)` (string match, then symbolic equivalence) when
the math environment is importable; otherwise falls back to `fallback_grade`: a normalised
string match plus exact numeric equality, where an integer ground truth is never matched by a
non-integer and fractions are compared as written (unreduced fractions must match exactly).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from fractions import Fraction

log = logging.getLogger(__name__)

_TEXT_RE = re.compile(r"\\(?:text|mathrm|textbf)\{([^{}]*)\}")
_NUMBER_RE = re.compile(r"[-+]?\d+(?:\.\d+)?")


def normalise(answer: str) -> str:
    """Canonical spelling: no $, \\text{}, \\left/\\right, spaces, thousands commas, final dot."""
    s = _TEXT_RE.sub(r"\1", str(answer))
    for token in ("$", "\\left", "\\right", "\\!", "\\,", "\\;", " ", "\n", "\t"):
        s = s.replace(token, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    return s.rstrip(".").lower()


def _number(s: str) -> Fraction | None:
    return Fraction(s) if _NUMBER_RE.fullmatch(s) else None


def fallback_grade(answer: str, ground_truth: str) -> float:
    """1.0 when `answer` matches `ground_truth` after normalisation (or as the same number)."""
    a, g = normalise(answer), normalise(ground_truth)
    if a == g:
        return 1.0
    a_num, g_num = _number(a), _number(g)
    if a_num is None or g_num is None:
        return 0.0
    return float(a_num == g_num)  # so an integer ground truth never matches a non-integer


def _math_grader() -> Callable[[str, str], float] | None:
    try:
        from envs.math import grade
    except Exception as exc:  # absent (ImportError) or broken: never fail the rollout over it
        if not isinstance(exc, ImportError):
            log.warning("envs.math failed to import (%r); using the fallback grader", exc)
        return None
    return grade


def grade_answer(answer: str | None, ground_truth: str) -> float:
    """0/1 reward for a committed `answer` (None: nothing committed, reward 0)."""
    if answer is None:
        return 0.0
    grader = _math_grader()
    if grader is None:
        return fallback_grade(answer, ground_truth)
    response = answer if "\\boxed" in answer else f"\\boxed{{{answer}}}"
    try:
        return float(grader(response, ground_truth))
    except Exception as exc:  # a grader failure must not kill the rollout: grade as wrong
        log.warning("envs.math.grade failed (%r); grading as 0", exc)
        return 0.0
