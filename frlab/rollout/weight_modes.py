"""How new weights meet the requests in flight (`rollout.weight_update`): the three modes
and how an engine resolves the one it runs. Light (no torch), so the config declarations
take their choices from here."""

from __future__ import annotations

from collections.abc import Sequence

# How new weights meet requests in flight (`rollout.weight_update`). In every mode each token's
# behaviour log-prob is the probability it was actually sampled with, and its version names
# the weights that sampled it; the modes differ in what those weights saw:
# - in_flight: the weights change between two decode steps; running requests keep their KV
#   cache (computed by the old weights) and go on sampling with the new ones.
# - resubmit: running requests stop at the update, keep their tokens and log-probs, and go on
#   from a fresh prefill of prompt + tokens on the new weights: no token is sampled on KV that
#   old weights computed (the partial-rollout approach).
# - drain: the update waits until every running request has finished (none starts meanwhile):
#   a request never spans two versions; the update waits for the longest one (an ablation).
WEIGHT_UPDATES = ("in_flight", "resubmit", "drain")


def resolve_weight_update(
    mode: str | None, supported: Sequence[str], engine: str, *, record_routing: bool = False
) -> str | None:
    """The mode an engine runs: `mode`, else the engine's default (the first it supports;
    None for an engine that declares none). ValueError, its text starting with the key
    `rollout.weight_update`, for a mode the engine does not implement exactly, and for
    resubmit with MoE routing recorded (`record_routing`): a re-prefilled position would have
    two routings."""
    key = "rollout.weight_update"
    if mode is None:
        return supported[0] if supported else None
    if mode not in WEIGHT_UPDATES:
        raise ValueError(
            f"{key} must be one of {', '.join(WEIGHT_UPDATES)} (or null), got {mode!r}"
        )
    if mode == "resubmit" and record_routing:
        raise ValueError(
            f"{key} resubmit re-prefills sampled tokens on the new weights, so a position would "
            "have two routings: not with model.routing_replay (use in_flight or drain)"
        )
    if mode not in supported:
        raise ValueError(
            f"{key} {mode!r} is not exact on the {engine} engine, which implements "
            f"{', '.join(supported) or 'no named mode (leave it null)'}"
        )
    return mode
