"""Held-out parts of a problem set, disjoint by construction (`holdout={fraction, part}`).

A procedural generator with a small problem space (one-digit sums: 121 distinct problems)
repeats its problems, so two sets drawn from it with different seeds overlap: an evaluation
on such a set measures memorisation, not generalisation. A hold-out instead splits the
DISTINCT questions by a hash of their text: a question is held out when the first 60 bits of
the SHA-256 of its stripped text, read as a fraction of 2**60, are below `fraction`. The rule
depends on the question alone, so for any sources and seeds the `train` part of one set and
the `heldout` part of another (same fraction) never share a question, and the same question
always falls on the same side. Both parts are deduplicated (first occurrence kept).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from frlab.errors import ConfigError

PARTS = ("train", "heldout")
KEYS = ("fraction", "part")
_SCALE = float(2**60)


def check_holdout(holdout: Any, key: str = "holdout") -> dict[str, Any] | None:
    """`holdout` as a plain dict {fraction, part} (None stays None); ValueError naming `key`."""
    if holdout is None:
        return None
    if not isinstance(holdout, Mapping):
        raise ConfigError(key, f"must be a mapping {{fraction, part}} or null, got {holdout!r}")
    unknown = sorted(set(holdout) - set(KEYS))
    if unknown:
        raise ConfigError(f"{key}.{unknown[0]}", "is not a holdout key (known: fraction, part)")
    fraction, part = holdout.get("fraction"), holdout.get("part")
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction < 1:
        raise ConfigError(f"{key}.fraction", f"must be a number in (0, 1), got {fraction!r}")
    if part not in PARTS:
        raise ConfigError(f"{key}.part", f"must be one of {', '.join(PARTS)}, got {part!r}")
    return {"fraction": float(fraction), "part": str(part)}


def question_hash(question: str) -> float:
    """The question's position in [0, 1): the first 60 bits of SHA-256 of its stripped text."""
    digest = hashlib.sha256(question.strip().encode("utf-8")).hexdigest()
    return int(digest[:15], 16) / _SCALE


def is_heldout(question: str, fraction: float) -> bool:
    """Whether `question` belongs to the held-out part of size `fraction`."""
    return question_hash(question) < fraction


def holdout_part(
    rows: Iterable[Mapping[str, Any]], fraction: float, part: str
) -> list[Mapping[str, Any]]:
    """The distinct-question rows of `part` (train | heldout), in their first-seen order."""
    want_heldout = part == "heldout"
    seen: set[str] = set()
    out = []
    for row in rows:
        question = str(row["question"]).strip()
        if question in seen:
            continue
        seen.add(question)
        if is_heldout(question, fraction) == want_heldout:
            out.append(row)
    return out
