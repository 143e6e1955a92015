"""Parse one assistant turn of the Python-tool agent: a tool call, a committed answer, or neither.

Tool calls: a Qwen-style XML call `<tool_call>{"name": "python", "arguments":
{"code": "..."}}</tool_call>` (arguments may also be a JSON-encoded string, as some chat
templates emit), or a fenced ```python block. The first call in the turn is run. A committed
answer is `<answer>...</answer>` or the last balanced `\\boxed{...}`, searched only in the text
outside tool calls and code blocks (code that prints LaTeX is not an answer).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

TOOL_NAME = "python"
TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
FENCE_RE = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL)
ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """A parsed call: the code to run, or the reason the call could not be parsed."""

    code: str | None
    error: str | None = None


def _call_from_json(payload: str) -> ToolCall:
    try:
        call = json.loads(payload)
    except json.JSONDecodeError as exc:
        return ToolCall(None, f"tool call is not valid JSON: {exc.msg}")
    if not isinstance(call, dict):
        return ToolCall(None, "tool call must be a JSON object with name and arguments")
    if call.get("name") != TOOL_NAME:
        return ToolCall(None, f"unknown tool {call.get('name')!r}; the only tool is {TOOL_NAME!r}")
    args = call.get("arguments", call.get("parameters"))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return ToolCall(None, "tool call arguments are not valid JSON")
    if not isinstance(args, dict) or not isinstance(args.get("code"), str):
        return ToolCall(None, 'tool call arguments must be {"code": "<python source>"}')
    return ToolCall(args["code"])


def parse_tool_call(text: str) -> ToolCall | None:
    """The first tool call in `text` (XML call first, else a fenced python block), or None."""
    xml = TOOL_CALL_RE.search(text)
    if xml is not None:
        return _call_from_json(xml.group(1))
    fence = FENCE_RE.search(text)
    if fence is not None:
        return ToolCall(fence.group(1))
    return None


def strip_code(text: str) -> str:
    """`text` without tool calls and fenced code blocks."""
    return FENCE_RE.sub(" ", TOOL_CALL_RE.sub(" ", text))


def last_boxed(text: str) -> str | None:
    """The content of the last balanced `\\boxed{...}` (or `\\fbox{...}`) in `text`, or None."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    for start in reversed(starts):
        depth, i = 1, start
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start : i - 1]
    return None


def committed_answer(text: str) -> str | None:
    """The final answer committed in `text` (last `<answer>`, else last `\\boxed{}`), or None."""
    prose = strip_code(text)
    answers = ANSWER_RE.findall(prose)
    if answers:
        return answers[-1].strip()
    boxed = last_boxed(prose)
    return boxed.strip() if boxed is not None else None
