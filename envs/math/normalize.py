"""String normalisation of math answers and exact readings of numeric literals.

`normalize_answer` maps equivalent spellings of one answer to one string: it removes math
delimiters (`$`, `\\(`), spacing commands, `\\left`/`\\right`, `\\text{}`-style wrappers,
degrees, percent and dollar signs, a trailing period, a leading `x =`, trailing unit words
after a number, thousands separators (`1,000`, `1{,}000`), and spaces (a space that separates a
LaTeX command
from a following letter is kept: `\\pi r` is not `\\pir`); `\\dfrac`/`\\tfrac` become
`\\frac` and `\\frac12`/`\\sqrt2` get their braces.

`parse_number` and `parse_fraction` read plain literals exactly (`fractions.Fraction`), so the
integer and fraction rules of the grader never depend on floating point.
"""

from __future__ import annotations

import re
from fractions import Fraction

_DROP = (
    "\\left",
    "\\right",
    "\\displaystyle",
    "\\!",
    "\\,",
    "\\;",
    "\\:",
    "\\ ",
    "\\$",
    "\\%",
    "^{\\circ}",
    "^\\circ",
    "°",
    "%",
    "$",
    "\\(",
    "\\)",
    "\\[",
    "\\]",
    "~",
)
_WRAPPERS = re.compile(
    r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname)\{([^{}]*)\}"
)
_NUMBER_WITH_UNITS = re.compile(r"^([-+]?[\d.,/]+)\s+[A-Za-z][A-Za-z\s.]*$")
_NUMBER_WITH_TEXT_UNITS = re.compile(r"^([-+]?[\d.,/]+)\s*\\(?:text|mbox|mathrm)\{[^{}]*\}$")
_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_LEADING_VARIABLE = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?!=)")
_DECIMAL = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)$")
_SLASH_FRACTION = re.compile(r"^(-?)\(?([-+]?\d+)\)?/\(?(\d+)\)?$")
_LATEX_FRACTION = re.compile(r"^(-?)\\frac\{([-+]?\d+)\}\{(\d+)\}$")


def _brace_shorthand(text: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{2}` -> `\\frac{1}{2}`, `\\sqrt2` -> `\\sqrt{2}`."""
    text = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", text)
    text = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", text)
    return re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", text)


def _remove_spaces(text: str) -> str:
    """Delete whitespace except one space between a LaTeX command and a following letter."""

    def keep_if_needed(match: re.Match[str]) -> str:
        before, after = text[: match.start()], text[match.end() :]
        needs = re.search(r"\\[A-Za-z]+$", before) and after[:1].isalpha()
        return " " if needs else ""

    return re.sub(r"\s+", keep_if_needed, text)


def normalize_answer(answer: str) -> str:
    """The canonical string form of an answer (see the module docstring)."""
    text = _NUMBER_WITH_TEXT_UNITS.sub(r"\1", str(answer).strip().replace("\u2212", "-"))
    for _ in range(3):  # nested wrappers: \text{\textbf{5}}
        text = _WRAPPERS.sub(r"\1", text)
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for token in _DROP:
        text = text.replace(token, "")
    text = text.strip().rstrip(".").strip()
    text = _LEADING_VARIABLE.sub("", text, count=1) if text.count("=") == 1 else text
    units = _NUMBER_WITH_UNITS.match(text)
    if units:
        text = units.group(1)
    text = _remove_spaces(_brace_shorthand(text)).replace("{,}", ",")
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    text = text.rstrip(".")
    if text.startswith("+"):
        text = text[1:]
    if text.startswith(".") or text.startswith("-."):
        text = text.replace(".", "0.", 1)
    return text


def parse_number(text: str) -> Fraction | None:
    """The exact value of a plain integer or decimal literal ("-3", "2.50", ".5"), else None."""
    if not _DECIMAL.match(text):
        return None
    return Fraction(text)


def is_integer_literal(text: str) -> bool:
    """Whether `text` is an integer or decimal literal with an integral value ("7", "7.0")."""
    value = parse_number(text)
    return value is not None and value.denominator == 1


def parse_fraction(text: str) -> tuple[int, int] | None:
    """(numerator, denominator) of `a/b` or `\\frac{a}{b}` as written (not reduced), the sign
    moved to the numerator; None when `text` is not such a fraction of integer literals."""
    match = _SLASH_FRACTION.match(text) or _LATEX_FRACTION.match(text)
    if match is None:
        return None
    sign, numerator, denominator = match.group(1), int(match.group(2)), int(match.group(3))
    if denominator == 0:
        return None
    return (-numerator if sign else numerator), denominator


def is_unreduced(fraction: tuple[int, int]) -> bool:
    """Whether a written fraction is not in lowest terms (numerator and denominator share a
    factor > 1, e.g. 2/4 or 4/2)."""
    from math import gcd

    numerator, denominator = fraction
    return gcd(numerator, denominator) > 1
