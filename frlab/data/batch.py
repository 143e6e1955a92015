"""Trajectory records and the padded `RolloutBatch` the learner consumes.

A `Trajectory` is one finished rollout (all agent turns) of one prompt. Token-aligned lists
share one index: `token_ids[t]`, `action_mask[t]` (True iff the policy sampled that token),
`behavior_log_probs[t]` (the sampler's own log-prob of that token, 0.0 elsewhere) and
`token_versions[t]` (the policy version that sampled it, -1 elsewhere). The first token is
always a prompt token, so a sampled token always has a context to be predicted from.

Optional MoE routing replay (frlab.model.routing_replay): `Trajectory.routing` `[n, L, k]`
holds the experts the sampler used at each forwarded position (n = len(token_ids), or one
less: the last sampled token is never fed back); `RolloutBatch.routing` is the right-padded
`[B, T, L, k]` the learner replays. Both are None when routing is not recorded.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from frlab.errors import ConfigError
from frlab.model.routing_replay import pad_routing


class TrajectoryError(ValueError):
    """A trajectory record that breaks the contract (misaligned, empty, non-finite)."""


@dataclass
class Trajectory:
    """One finished rollout; validated on construction."""

    token_ids: list[int]
    action_mask: list[bool]
    behavior_log_probs: list[float]
    token_versions: list[int]
    reward: float
    prompt_id: int
    failure: bool = False
    truncated: bool = False
    turn_boundaries: list[int] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    routing: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        self._check_routing(n)
        for name in ("action_mask", "behavior_log_probs", "token_versions"):
            if len(getattr(self, name)) != n:
                raise TrajectoryError(
                    f"Trajectory.{name} has length {len(getattr(self, name))}, token_ids has {n}"
                )
        if n == 0:
            raise TrajectoryError("Trajectory.token_ids is empty")
        if self.action_mask[0]:
            raise TrajectoryError(
                "Trajectory.action_mask[0] is True: the first token must be prompt"
            )
        if not any(self.action_mask):
            raise TrajectoryError("Trajectory has zero action tokens (action_mask all False)")
        if not math.isfinite(float(self.reward)):
            raise TrajectoryError(f"Trajectory.reward is not finite: {self.reward}")
        for t, (a, lp, v) in enumerate(
            zip(self.action_mask, self.behavior_log_probs, self.token_versions, strict=True)
        ):
            if a and not (math.isfinite(lp) and lp <= 0.0):
                raise TrajectoryError(f"Trajectory.behavior_log_probs[{t}]={lp} is not a log-prob")
            if a and v < 0:
                raise TrajectoryError(f"Trajectory.token_versions[{t}]={v} on an action token")
        if any(b < 0 or b > n for b in self.turn_boundaries):
            raise TrajectoryError("Trajectory.turn_boundaries out of range")

    def _check_routing(self, n: int) -> None:
        r = self.routing
        if r is None:
            return
        if not isinstance(r, torch.Tensor) or r.is_floating_point() or r.dim() != 3:
            raise TrajectoryError("Trajectory.routing must be an integer tensor [n, L, k]")
        if r.shape[0] not in (n, n - 1):
            raise TrajectoryError(
                f"Trajectory.routing has {r.shape[0]} positions, token_ids has {n} "
                f"(expected {n} or {n - 1})"
            )

    @property
    def num_action_tokens(self) -> int:
        return sum(self.action_mask)

    @property
    def min_version(self) -> int:
        return min(v for v, a in zip(self.token_versions, self.action_mask, strict=True) if a)

    @property
    def max_version(self) -> int:
        return max(v for v, a in zip(self.token_versions, self.action_mask, strict=True) if a)


@dataclass
class RolloutBatch:
    """Right-padded tensors for B trajectories, all of width T.

    input_ids/position_ids/token_versions: long [B,T]; attention_mask/action_mask: bool [B,T];
    behavior_log_probs: float [B,T] (0 off-action); rewards: float [B]; failures/truncated:
    bool [B]; prompt_ids: long [B] (group ids for group baselines); routing: int16
    [B,T,L,k] recorded MoE experts, or None when routing replay is off.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    action_mask: torch.Tensor
    behavior_log_probs: torch.Tensor
    token_versions: torch.Tensor
    rewards: torch.Tensor
    failures: torch.Tensor
    truncated: torch.Tensor
    prompt_ids: torch.Tensor
    infos: list[dict[str, Any]] = field(default_factory=list)
    routing: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    def tensor_fields(self) -> dict[str, torch.Tensor]:
        """Every tensor field by name (an absent optional `routing` is left out)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "infos"}
        return {k: v for k, v in out.items() if v is not None}

    def to(self, device: torch.device | str) -> RolloutBatch:
        moved = {k: v.to(device) for k, v in self.tensor_fields().items()}
        return RolloutBatch(**moved, infos=self.infos)

    def select(self, index: torch.Tensor | slice) -> RolloutBatch:
        """Rows `index` (a slice or a long index tensor) as a new batch."""
        rows = {k: v[index] for k, v in self.tensor_fields().items()}
        if isinstance(index, slice):
            infos = self.infos[index]
        else:
            infos = [self.infos[i] for i in index.tolist()] if self.infos else []
        return RolloutBatch(**rows, infos=infos)

    def trim(self) -> RolloutBatch:
        """Drop trailing columns that are padding in every row."""
        width = int(self.attention_mask.sum(dim=1).max().item())
        rows = {
            k: (v[:, :width] if v.dim() == 2 or k == "routing" else v)
            for k, v in self.tensor_fields().items()
        }
        return RolloutBatch(**rows, infos=self.infos)


def world_size(trainer: Mapping[str, Any]) -> int:
    """Learner ranks: `trainer.devices` (an int, a list of ids, or auto: 1) x `num_nodes`;
    ConfigError(`trainer.devices`) for anything else."""
    devices = trainer.get("devices", 1)
    if isinstance(devices, list | tuple):
        n = len(devices)
    elif isinstance(devices, int) and not isinstance(devices, bool):
        n = devices
    elif isinstance(devices, str) and devices.lstrip("-").isdigit():
        n = int(devices)
    elif devices == "auto":
        n = 1
    else:
        raise ConfigError(
            "trainer.devices", f"must be an int, a list of ids or 'auto', got {devices!r}"
        )
    if n < 1 and n != -1:
        raise ConfigError("trainer.devices", f"must be >= 1, got {devices!r}")
    return max(n, 1) * int(trainer.get("num_nodes", 1))


def per_rank_batch(batch_size: int, world: int) -> int:
    """Each of `world` ranks' share of a global batch of `batch_size` trajectories
    (`data.batch_size`, the B of the objective's normalisation); ConfigError unless whole."""
    if world < 1 or batch_size % world:
        raise ConfigError(
            "data.batch_size",
            f"({batch_size}) must be divisible by the number of ranks, "
            f"trainer.devices x trainer.num_nodes = {world}",
        )
    return batch_size // world


def check_batch(data: Mapping[str, Any], rollout: Mapping[str, Any], world: int) -> None:
    """The batch splits into whole micro-batches and whole groups of `samples_per_prompt` on
    every one of `world` ranks (ConfigError naming the key)."""
    b, micro, g = data["batch_size"], data["micro_batch_size"], rollout["samples_per_prompt"]
    per_rank = per_rank_batch(b, world)
    if per_rank % micro:
        raise ConfigError(
            "data.micro_batch_size",
            f"({micro}) must divide the per-rank batch data.batch_size / ranks = {per_rank}",
        )
    if b % g:
        raise ConfigError(
            "data.batch_size",
            f"({b}) must be a multiple of rollout.samples_per_prompt ({g}): whole groups per batch",
        )
    if per_rank % g:
        raise ConfigError(
            "rollout.samples_per_prompt",
            f"({g}) must divide the per-rank batch "
            f"data.batch_size / ranks = {b} / {world} = {per_rank}: each rank's "
            f"pool collects whole groups of {g} rollouts into its {per_rank} "
            f"trajectories; use data.batch_size a multiple of {g * world} or fewer "
            "samples per prompt",
        )
    if rollout["max_in_flight"] < g:
        raise ConfigError(
            "rollout.max_in_flight",
            f"({rollout['max_in_flight']}) must be >= "
            f"rollout.samples_per_prompt ({g}): a group's rollouts are started "
            "together",
        )


def collate(trajectories: list[Trajectory], pad_token_id: int = 0) -> RolloutBatch:
    """Right-pad finished trajectories into one `RolloutBatch`.

    Each field is built from one flat list scattered under the [B, width] mask (row-major, so
    row i gets its own tokens in order): a handful of tensor calls per batch instead of several
    per trajectory, which on small models was a visible part of a learner step."""
    if not trajectories:
        raise ValueError("collate needs at least one trajectory")
    lengths = torch.tensor([len(tr.token_ids) for tr in trajectories], dtype=torch.long)
    width = int(lengths.max())
    attention = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)

    def padded(name: str, dtype: torch.dtype, fill: float | int | bool) -> torch.Tensor:
        flat = list(itertools.chain.from_iterable(getattr(tr, name) for tr in trajectories))
        out = torch.full(attention.shape, fill, dtype=dtype)
        out[attention] = torch.tensor(flat, dtype=dtype)
        return out

    input_ids = padded("token_ids", torch.long, pad_token_id)
    action = padded("action_mask", torch.bool, False)
    behavior = padded("behavior_log_probs", torch.float32, 0.0)
    versions = padded("token_versions", torch.long, -1)
    positions = (attention.long().cumsum(dim=1) - 1).clamp_min(0)
    return RolloutBatch(
        routing=_collate_routing(trajectories, width),
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=positions,
        action_mask=action,
        behavior_log_probs=behavior,
        token_versions=versions,
        rewards=torch.tensor([float(tr.reward) for tr in trajectories], dtype=torch.float32),
        failures=torch.tensor([bool(tr.failure) for tr in trajectories], dtype=torch.bool),
        truncated=torch.tensor([bool(tr.truncated) for tr in trajectories], dtype=torch.bool),
        prompt_ids=torch.tensor([int(tr.prompt_id) for tr in trajectories], dtype=torch.long),
        infos=[dict(tr.info) for tr in trajectories],
    )


def _collate_routing(trajectories: list[Trajectory], width: int) -> torch.Tensor | None:
    """`[B, width, L, k]` routing when every trajectory has one, None when none has."""
    present = [tr.routing is not None for tr in trajectories]
    if not any(present):
        return None
    if not all(present):
        missing = [i for i, p in enumerate(present) if not p][:5]
        raise ValueError(
            f"collate: Trajectory.routing is None for rows {missing} but set for others"
        )
    return pad_routing([tr.routing for tr in trajectories], width)  # type: ignore[misc]
