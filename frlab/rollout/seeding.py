"""Per-rollout sampling seeds: the random numbers a rollout gets depend on what it is, not on when.

Each rollout's seed is derived from (run seed, prompt id, sample index in its group, weight
version at its start), and each engine request of the rollout from (rollout seed, turn). So
which other rollouts share an engine batch, the order requests arrive in, or thread timing
never change a rollout's draws, and a rollout rerun after a resume (same prompt, same version)
draws the same numbers. The derivation is a keyed hash (blake2b), identical in every process
(Python's `hash()` is salted per process).
"""

from __future__ import annotations

import hashlib

SEED_BITS = 63  # a non-negative signed 64-bit integer: torch, vLLM and the OpenAI API accept it


def derive_seed(*parts: int) -> int:
    """A seed in [0, 2**63) from integers; the same parts give the same seed everywhere."""
    data = b"".join(int(p).to_bytes(16, "little", signed=True) for p in parts)
    digest = hashlib.blake2b(data, digest_size=8, person=b"frlab-rollout").digest()
    return int.from_bytes(digest, "little") >> (64 - SEED_BITS)


def rollout_seed(seed: int, prompt_id: int, sample: int, version: int) -> int:
    """The seed of one rollout: sample `sample` of prompt `prompt_id`, started at `version`."""
    return derive_seed(seed, prompt_id, sample, version)


def turn_seed(rollout: int, turn: int) -> int:
    """The seed of the engine request of turn `turn` (0-based) of a rollout."""
    return derive_seed(rollout, turn)
