"""Answer extraction from a model's reply (math environment).

`extract_answer(response, answer_format="any")`. Formats:

- `any` (the default; the FlashREINFORCE reference's order), first hit wins:
  1. the content of the LAST balanced `\\boxed{...}` (or `\\fbox{...}`), nested braces
     allowed; an unbalanced (truncated) box is skipped, so an earlier balanced one still
     counts; `\\boxed 5` (no braces) takes the next token;
  2. the answer after the last final-answer phrase ("final answer", "the answer is",
     "answer:", GSM8K's "####"), read from the rest of that line by `phrase_answer`;
  3. the last number in the reply (integers, decimals, `a/b`, `\\frac{a}{b}`, thousands
     commas).
- `boxed` (strict): only the last balanced box; a reply without one has no answer.
- `final_line` (strict): the last non-empty line of the reply must itself be the answer (a
  box in it, the answer after a final-answer phrase in it, or the whole line); a line of prose
  ("Step 2: 4 + 1 = 5", a reply cut off mid-sentence) has no answer. Use a strict format
  when the last-number fallback would give chance matches on truncated replies.

A reply with no answer gives None, which grades 0.

`phrase_answer` (the text after a phrase): the reference grader takes the rest of the line
after the phrase (up to a newline, `<` or `|`), which loses "The final answer is still 4 + 1
which is 5."; here that rest of the line is read as follows: a balanced box in it wins, then
its first `$...$` span; then, when it is prose (a word of two or more letters that is not
a LaTeX command or a math word such as sqrt, pi, log), the last number in it; otherwise
the whole rest of the line (`x = 4`, `\\frac{3}{4}`, `2\\sqrt{3}`) without `**` and a
final period.
"""

from __future__ import annotations

import re

_BOX_COMMANDS = ("\\boxed", "\\fbox")
ANSWER_FORMATS = ("any", "boxed", "final_line")
_PHRASE = re.compile(
    r"(?:final\s+answer(?:\s+is)?|the\s+answer\s+is|answer\s*:|####)\s*[:：]?",
    re.IGNORECASE,
)
_NUMBER = re.compile(
    r"[-+]?\\frac\{\d+\}\{\d+\}"
    r"|[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|[-+]?\.\d+"
)
_LINE_END = re.compile(r"[\n<|]")  # the reference grader's end of a phrase's answer
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_MATH_WORDS = frozenset(
    "sqrt pi sin cos tan cot sec csc log ln exp arcsin arccos arctan sinh cosh tanh inf "
    "infty infinity mod gcd lcm max min det frac".split()
)


def _braced_from(text: str, open_at: int) -> str | None:
    """The content of the brace group opening at `text[open_at] == '{'`, or None if unbalanced."""
    depth = 0
    for i in range(open_at, len(text)):
        char = text[i]
        escaped = i > 0 and text[i - 1] == "\\"  # `\{` is a literal brace, not a group
        if char == "{" and not escaped:
            depth += 1
        elif char == "}" and not escaped:
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
    return None


def _box_content(text: str, start: int, command: str) -> str | None:
    """The argument of the box command found at `start`, or None if it has none."""
    rest = start + len(command)
    if rest < len(text) and text[rest] == "{":
        return _braced_from(text, rest)
    if rest < len(text) and text[rest] == " ":
        token = re.match(r"\s+([^\s$]+)", text[rest:])
        return token.group(1) if token else None
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last balanced `\\boxed{...}` / `\\fbox{...}` in `text`, or None."""
    starts = sorted(
        (m.start(), command)
        for command in _BOX_COMMANDS
        for m in re.finditer(re.escape(command) + r"(?![A-Za-z])", text)
    )
    for start, command in reversed(starts):
        content = _box_content(text, start, command)
        if content is not None and content.strip():
            return content.strip()
    return None


def is_prose(text: str) -> bool:
    """Whether `text` holds a word of two or more letters that is neither a LaTeX command
    (`\\frac`) nor a math word (sqrt, pi, log, ...): "still 4 + 1 which is 5" is prose,
    "2\\sqrt{3}", "x = 4" and "sqrt(2)/2" are not."""
    return any(w.group().lower() not in _MATH_WORDS for w in _WORD.finditer(text))


def _clean(text: str) -> str:
    """`text` without `**` emphasis, surrounding space and a final period."""
    return text.replace("**", "").strip().rstrip(".").strip()


def phrase_answer(tail: str) -> str | None:
    """The answer in the text after a final-answer phrase (rules in the module docstring):
    a box, the first `$...$` span, the last number of prose, else the cleaned line."""
    line = _LINE_END.split(tail.strip(), 1)[0]
    boxed = last_boxed(line)
    if boxed is not None:
        return boxed
    span = re.search(r"\$([^$]+)\$", line)
    if span and span.group(1).strip():
        return _clean(span.group(1))
    line = _clean(line)
    if is_prose(line):
        return last_number(line) or line or None
    return line or None


def after_final_phrase(text: str) -> str | None:
    """The answer after the last final-answer phrase, or None when there is none (or empty)."""
    for match in reversed(list(_PHRASE.finditer(text))):
        answer = phrase_answer(text[match.end() :])
        if answer:
            return answer
    return None


def last_number(text: str) -> str | None:
    """The last number in `text` (e.g. "-1,234.5", "3/4", "\\frac{3}{4}"), spaces inside
    `a / b` removed."""
    matches = _NUMBER.findall(text)
    return re.sub(r"\s+", "", matches[-1]) if matches else None


def final_line_answer(text: str) -> str | None:
    """The answer the last non-empty line states by itself (strict `final_line` format): a
    box in it, the answer after a final-answer phrase in it, or the whole line when it is not
    prose; None otherwise."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    line = lines[-1]
    for extractor in (last_boxed, after_final_phrase):
        answer = extractor(line)
        if answer is not None:
            return answer
    span = re.fullmatch(r"\$([^$]+)\$\.?", line)
    line = _clean(span.group(1)) if span else _clean(line)
    return None if not line or is_prose(line) else line


def extract_answer(response: str, answer_format: str = "any") -> str | None:
    """The answer a reply commits to in `answer_format` (any | boxed | final_line); None
    when the reply has none."""
    if not isinstance(response, str):
        raise TypeError(f"response must be a str, got {type(response).__name__}")
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(
            f"answer_format must be one of {', '.join(ANSWER_FORMATS)}, got {answer_format!r}"
        )
    response = response.replace("\u2212", "-")  # Unicode minus sign
    if answer_format == "boxed":
        return last_boxed(response)
    if answer_format == "final_line":
        return final_line_answer(response)
    for extractor in (last_boxed, after_final_phrase, last_number):
        answer = extractor(response)
        if answer is not None:
            return answer
    return None
