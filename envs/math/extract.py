"""Answer extraction from a model's reply (math environment).

Order, first hit wins:
1. the content of the LAST balanced `\\boxed{...}` (or `\\fbox{...}`), nested braces allowed;
   an unbalanced (truncated) box is skipped, so an earlier balanced one still counts;
   `\\boxed 5` (no braces) takes the next token;
2. the text after the last final-answer phrase ("final answer", "the answer is", "answer:",
   GSM8K's "####"), up to the end of that line;
3. the last number in the reply (integers, decimals, `a/b`, thousands commas).
A reply with none of them has no answer (None), which grades 0.
"""

from __future__ import annotations

import re

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_PHRASE = re.compile(
    r"(?:final\s+answer(?:\s+is)?|the\s+answer\s+is|answer\s*:|####)\s*[:：]?",
    re.IGNORECASE,
)
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|[-+]?\.\d+")


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


def _clean_phrase_tail(tail: str) -> str:
    """The answer text after a phrase: its first line, without `$`, `**` and a final period."""
    line = tail.strip().split("\n", 1)[0].strip()
    line = line.replace("**", "").strip()
    if line.startswith("$") and line.count("$") >= 2:
        line = line[1 : line.index("$", 1)]
    line = line.strip().rstrip(".").strip()
    return line


def after_final_phrase(text: str) -> str | None:
    """The answer after the last final-answer phrase, or None when there is none (or empty)."""
    matches = list(_PHRASE.finditer(text))
    for match in reversed(matches):
        tail = text[match.end() :]
        boxed = last_boxed(tail.split("\n", 1)[0])
        answer = boxed if boxed is not None else _clean_phrase_tail(tail)
        if answer:
            return answer
    return None


def last_number(text: str) -> str | None:
    """The last number in `text` (e.g. "-1,234.5", "3/4"), spaces inside `a / b` removed."""
    matches = _NUMBER.findall(text)
    return re.sub(r"\s+", "", matches[-1]) if matches else None


def extract_answer(response: str) -> str | None:
    """The answer a reply commits to: last balanced box, else final-answer phrase, else the
    last number; None when the reply has none of them."""
    if not isinstance(response, str):
        raise TypeError(f"response must be a str, got {type(response).__name__}")
    response = response.replace("\u2212", "-")  # Unicode minus sign
    for extractor in (last_boxed, after_final_phrase, last_number):
        answer = extractor(response)
        if answer is not None:
            return answer
    return None
