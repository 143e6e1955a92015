"""Shared grading for the toy environments: the reply must START with a digit of a given parity.

Only the first non-space character counts, so a random policy's success rate (~5 of ~60
tokens) does not grow with the per-turn token budget, and the answer is one token.

Answering with "any digit of the right parity" (five correct tokens, not one) keeps a tiny
random-init policy from collapsing onto one constant answer before it has learned to read the
prompt: with a single correct token per class, REINFORCE often locks onto the token that
wins half the time (reward 0.5) and its gradient vanishes there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def first_digit(text: str) -> int | None:
    """The digit that `text` starts with (leading spaces ignored), or None."""
    head = text.lstrip()[:1]
    return int(head) if head in "0123456789" and head else None


def same_parity(action_text: str, digit: int) -> bool:
    """Whether the reply starts with a digit of the parity of `digit`."""
    given = first_digit(action_text)
    return given is not None and given % 2 == digit % 2


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
        raise ValueError(
            f"toy task field {name!r} must be a non-empty list of digits, got {values!r}"
        )
    return [digit_field({name: v}, name) for v in values]
