"""`LearnerSettings`: what the learner reads of a run's config, as one small frozen object.

Every field is a config key declared (type, default, range) in frlab.config.schema and checked
by preflight, so the learner takes the values as they are and never defaults or re-checks one.
`from_sections` reads them from a run's resolved sections (what preflight returns); a Python
caller builds them from the declarations' defaults the same way:

    settings = LearnerSettings.from_sections(preflight(compose(["experiment=toy_cpu"])).sections)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LearnerSettings:
    """The learner's settings; each field names the config key it comes from."""

    batch_size: int  # data.batch_size: B, global
    micro_batch_size: int  # data.micro_batch_size: rows per forward/backward on one rank
    max_tokens_per_micro_batch: int | None  # data.max_tokens_per_micro_batch (auto resolved)
    pack_sequences: bool  # data.pack_sequences
    temperature: float  # rollout.sampling.temperature: the learner applies it as the sampler did
    max_steps: int  # trainer.max_steps
    grad_clip: float  # optim.grad_clip (0: off)
    skip_zero_signal_steps: bool  # optim.skip_zero_signal_steps
    scheduler: str  # optim.scheduler
    warmup_ratio: float  # optim.warmup_ratio
    min_lr_ratio: float  # optim.min_lr_ratio
    schedule_steps: int | None  # optim.schedule_steps (null: trainer.max_steps)
    logprob_chunk_size: int  # model.logprob_chunk_size
    routing_replay: bool  # model.routing_replay
    compile: bool  # model.compile

    @classmethod
    def from_sections(cls, sections: Mapping[str, Mapping[str, Any]]) -> LearnerSettings:
        """From a run's resolved `data`, `rollout`, `trainer`, `optim` and `model` sections."""
        data, optim, model = sections["data"], sections["optim"], sections["model"]
        return cls(
            batch_size=data["batch_size"],
            micro_batch_size=data["micro_batch_size"],
            max_tokens_per_micro_batch=data["max_tokens_per_micro_batch"],
            pack_sequences=data["pack_sequences"],
            temperature=float(sections["rollout"]["sampling"]["temperature"]),
            max_steps=sections["trainer"]["max_steps"],
            grad_clip=float(optim["grad_clip"]),
            skip_zero_signal_steps=optim["skip_zero_signal_steps"],
            scheduler=optim["scheduler"],
            warmup_ratio=float(optim["warmup_ratio"]),
            min_lr_ratio=float(optim["min_lr_ratio"]),
            schedule_steps=optim["schedule_steps"],
            logprob_chunk_size=model["logprob_chunk_size"],
            routing_replay=model["routing_replay"],
            compile=model["compile"],
        )

    @property
    def clip_norm(self) -> float:
        """`grad_clip` as a max norm (0 disables clipping: inf)."""
        return math.inf if self.grad_clip == 0 else self.grad_clip

    @property
    def schedule_length(self) -> int:
        """The lr schedule's length: `optim.schedule_steps`, else `trainer.max_steps`."""
        return self.schedule_steps if self.schedule_steps is not None else self.max_steps


def check_policy(policy: Any, settings: LearnerSettings) -> None:
    """What the settings need of the built policy (preflight cannot see it): an MoE policy for
    routing replay, an attention implementation whose packed forward is exact for packing."""
    from frlab.model.packed_attention import check_packable
    from frlab.model.routing_replay import moe_routers

    if settings.routing_replay:
        try:
            moe_routers(policy)
        except (TypeError, ValueError) as exc:
            from frlab.errors import ConfigError

            raise ConfigError("model.routing_replay", f"needs an MoE policy: {exc}") from exc
    if settings.pack_sequences:
        check_packable(policy)
