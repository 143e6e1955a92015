"""Shared grading for the toy environments: the answer is the first digit of the reply."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def first_digit(text: str) -> int | None:
    """The first decimal digit in `text`, or None when it has none."""
    for ch in text:
        if "0" <= ch <= "9":
            return int(ch)
    return None


def digit_field(task: Mapping[str, Any], name: str) -> int:
    """`task[name]` as a digit 0-9, or a ValueError naming the field."""
    if name not in task:
        raise ValueError(f"toy task is missing field {name!r}")
    value = task[name]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 9:
        raise ValueError(f"toy task field {name!r} must be a digit 0-9, got {value!r}")
    return value


def digits_field(task: Mapping[str, Any], name: str) -> list[int]:
    """`task[name]` as a non-empty list of digits, or a ValueError naming the field."""
    values = task.get(name)
    if not isinstance(values, (list, tuple)) or not values:
        raise ValueError(f"toy task field {name!r} must be a non-empty list of digits, got {values!r}")
    return [digit_field({name: v}, name) for v in values]
