"""The inference-engine interface shared by the rollout pool and the agent loop.

An engine turns prompt token ids into sampled token ids (token in, token out: no
re-tokenisation between turns) and records, for every sampled token, the log-prob of the
distribution it was actually drawn from and the weight version that drew it. FlashREINFORCE
(paper, Sec. 3) needs the sampler's own probabilities: recomputing an "old" log-prob later does
not reproduce what the engine used (other kernels, batch shapes, MoE routing). Importance
sampling also needs the full support, so with off-policy correction on, top-p / top-k
truncation is refused at start.

`SamplingParams.seed` (set per request by the agent loop, derived from the run seed, prompt id,
sample index, weight version and turn: frlab.rollout.seeding) makes a request's random draws
independent of what else the engine is serving; None lets the engine use its own stream.

Implementations, one folder each (this module imports none of them): `torch` and
`torch_process` (frlab.rollout.torch: CPU/CUDA, the test default), `vllm` (frlab.rollout.vllm:
vLLM in-process, on a GPU or with vLLM's CPU build; vllm itself is imported when the engine
starts) and `remote` (frlab.rollout.remote: a fleet of vLLM / frlab.serve servers over HTTP).
A run picks one with the config group `rollout/engine=NAME`, whose node names the engine's
`for_policy` constructor; preflight asks the class to check its settings (`check_config`). How new
weights meet the requests in flight, and the steps of it the backends share, is
frlab.rollout.weight_modes. This module imports no torch (only when a result carries MoE
routing), so the config declarations can read it.
"""

from __future__ import annotations

import abc
import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from frlab.errors import ConfigError

if TYPE_CHECKING:
    import torch

SEED_LIMIT = 2**63  # per-request seeds fit a signed 64-bit integer (vLLM's and torch's range)

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
    None for an engine that declares none). ConfigError naming `rollout.weight_update` for a mode
    the engine does not implement exactly, and for
    resubmit with MoE routing recorded (`record_routing`): a re-prefilled position would have
    two routings."""
    key = "rollout.weight_update"
    if mode is None:
        return supported[0] if supported else None
    if mode not in WEIGHT_UPDATES:
        raise ConfigError(
            key, f"must be one of {', '.join(WEIGHT_UPDATES)} (or null), got {mode!r}"
        )
    if mode == "resubmit" and record_routing:
        raise ConfigError(
            key,
            "resubmit re-prefills sampled tokens on the new weights, so a position would have "
            "two routings: not with model.routing_replay (use in_flight or drain)",
        )
    if mode not in supported:
        raise ConfigError(
            key,
            f"{mode!r} is not exact on the {engine} engine, which implements "
            f"{', '.join(supported) or 'no named mode (leave it null)'}",
        )
    return mode


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one turn. `top_k=0` and `top_p=1.0` mean "off" (full support).

    `seed`: this request's own random stream (an int in [0, 2**63), None = the engine's shared
    stream). It is not a config key: the agent loop derives it per rollout and turn."""

    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    seed: int | None = None

    def validate(self, off_policy_correction: bool) -> None:
        """Raise ValueError naming the config key of the first invalid field."""
        t = float(self.temperature)
        if not (math.isfinite(t) and t > 0.0):
            raise ConfigError(
                "rollout.sampling.temperature", f"must be > 0, got {self.temperature}"
            )
        if not (0.0 < float(self.top_p) <= 1.0):
            raise ConfigError("rollout.sampling.top_p", f"must be in (0, 1], got {self.top_p}")
        if int(self.top_k) < 0:
            raise ConfigError("rollout.sampling.top_k", f"must be >= 0 (0 = off), got {self.top_k}")
        if int(self.max_new_tokens) < 1:
            raise ConfigError(
                "rollout.sampling.max_new_tokens", f"must be >= 1, got {self.max_new_tokens}"
            )
        seed = self.seed
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT
        ):
            raise ValueError(
                f"SamplingParams.seed must be None or an int in [0, 2**63), got {seed!r}"
            )
        if off_policy_correction and float(self.top_p) < 1.0:
            raise ConfigError(
                "rollout.sampling.top_p",
                f"rollout.sampling.top_p={self.top_p} < 1 is refused with off-policy correction: "
                "importance sampling needs the full support (set top_p=1.0)",
            )
        if off_policy_correction and int(self.top_k) > 0:
            raise ConfigError(
                "rollout.sampling.top_k",
                f"rollout.sampling.top_k={self.top_k} is refused with off-policy correction: "
                "importance sampling needs the full support (set top_k=0)",
            )

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any]) -> SamplingParams:
        """Build from a resolved `rollout.sampling` node; a ConfigError names an unknown or a
        missing key."""
        cfg = dict(cfg)
        required = ("temperature", "top_p", "top_k", "max_new_tokens")
        unknown = sorted(set(cfg) - {*required, "stop_token_ids"})
        if unknown:
            raise ConfigError(f"rollout.sampling.{unknown[0]}", "is not a sampling key")
        missing = [k for k in required if k not in cfg]
        if missing:
            raise ConfigError(f"rollout.sampling.{missing[0]}", "is missing")
        if "stop_token_ids" in cfg:
            cfg["stop_token_ids"] = tuple(int(i) for i in (cfg["stop_token_ids"] or ()))
        return cls(**cfg)


def request_seed(params: SamplingParams, base: int, count: int) -> int:
    """The seed an engine samples a request with: the request's own (`params.seed`, so its
    draws do not depend on what else the engine serves), else `base + count` (the engine's
    running count of requests) for callers that set none."""
    return int(params.seed) if params.seed is not None else int(base) + int(count)


@dataclass
class GenerationResult:
    """One generate call: the sampled tokens, the sampler's log-probs and weight versions.

    `routing` (optional, MoE routing replay, frlab.model.routing_replay): the experts the
    engine used for every position it forwarded, int16 `[len(prompt) + len(tokens) - 1, L, k]`
    (the last sampled token is never fed back); None when the engine does not record it.
    """

    token_ids: list[int]
    log_probs: list[float]
    versions: list[int]
    finish_reason: str  # "stop" | "length"
    routing: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.log_probs) != n or len(self.versions) != n:
            raise ValueError(
                f"GenerationResult lengths differ: token_ids {n}, log_probs "
                f"{len(self.log_probs)}, versions {len(self.versions)}"
            )
        if self.finish_reason not in ("stop", "length"):
            raise ValueError(
                f"GenerationResult.finish_reason must be stop|length, got {self.finish_reason!r}"
            )
        r = self.routing
        if r is not None:
            import torch  # only with routing: this module stays light (the config imports it)

            if not isinstance(r, torch.Tensor) or r.dim() != 3 or r.is_floating_point():
                raise ValueError("GenerationResult.routing must be an integer tensor [T, L, k]")


class EngineError(RuntimeError):
    """An engine request that could not be served (engine stopped, bad input, backend error)."""


class EngineFault(EngineError):
    """A request the engine could not serve through no fault of the request itself: a transport
    error, a dead, restarting or unresponsive server, a server-side 5xx, a weight push that did
    not reach its server, an answer refused as malformed. Trying the same request later may
    succeed, so the rollout pool requeues its prompt (`rollout.max_prompt_retries`) instead of
    dropping it; any other EngineError (a request the engine refuses) costs the rollout."""


@dataclass(frozen=True)
class Outage:
    """The engine can serve nothing right now, but may again: every server of a fleet is down.

    `since`: when it began (`time.monotonic()`); `reason`: what the engine knows (each server and
    its last error); `deadline_s`: how long it may last before `Engine.down_reason()` calls the
    engine down for good and the run stops (None: never)."""

    since: float
    reason: str
    deadline_s: float | None = None


class EngineDown(EngineError):
    """The engine can serve no request for the rest of the run (its process died, every server
    of its fleet stayed down past its deadline): the run stops, with its checkpoint, instead of
    failing rollouts forever. Raised by the rollout pool from `Engine.down_reason()`."""


class Engine(abc.ABC):
    """Asynchronous token-in/token-out sampler with versioned weights."""

    serves_lora: bool = False  # samples from a LoRA policy and loads adapter-only pushes
    records_routing: bool = False  # returns each token's MoE experts (routing replay)
    devices: tuple[str, ...] = ("cpu", "cuda")  # device types it samples on (rollout.device)
    reads_fleet: bool = False  # reads the `rollout.remote` block (a fleet of servers)
    # every learner rank drives the same engine (a shared fleet): weight pushes are collective
    # (frlab.rollout.callbacks.push_collectively, through its hold_for_update, stop_for_update
    # and release_update)
    shared_across_ranks: bool = False
    # on CUDA, preallocates a share of the learner's GPU; the dry run's memory plan sizes it as
    # vLLM's (rollout.vllm_engine_args gpu_memory_utilization, dtype)
    reserves_gpu_share: bool = False

    @classmethod
    def check_config(
        cls, config: Mapping[str, Any], world: int, options: Mapping[str, str]
    ) -> None:
        """Raise ConfigError(key, reason) for what of the resolved `model`, `rollout` and
        `trainer` sections (`config`) this engine cannot honour with `world` learner ranks,
        from what the class declares: MoE routing records, the device it samples on, the
        learner it serves beside (what this machine has), LoRA policies, the weight-update
        mode, a fleet block, then `check_settings`. `options`: the rollout/engine options (name ->
        `_target_`), to name this one and, in a refusal, those that would do."""
        rollout, model = config["rollout"], config["model"]
        name = next(
            (n for n, t in options.items() if t == rollout["engine"]["_target_"]),
            str(rollout["engine"]["_target_"]),
        )
        if model.get("routing_replay") and not cls.records_routing:
            able = " or ".join(
                f"rollout/engine={n}" for n in _options_that(options, "records_routing")
            )
            raise ConfigError(
                "model.routing_replay",
                f"needs an engine that records MoE routing ({able}), got {name!r}",
            )
        cls._check_device(name, rollout)
        try:
            cls.check_learner(str(config["trainer"]["accelerator"]))
        except ConfigError:
            raise  # keyed by the engine (trainer.accelerator, ...)
        except ValueError as exc:  # an engine's plain refusal: the engine is the key
            raise ConfigError("rollout.engine", f"{name!r}: {exc}") from exc
        modes, label = cls.weight_updates(), name
        if cls._check_lora(name, model) and hasattr(cls, "lora_weight_updates"):
            modes, label = cls.lora_weight_updates(), f"{name} (with model.lora)"
        resolve_weight_update(
            rollout.get("weight_update"),
            tuple(modes),
            label,
            record_routing=bool(model.get("routing_replay")),
        )
        if rollout.get("remote") is not None and not cls.reads_fleet:
            raise ConfigError(
                "rollout.engine",
                f"is {name!r} but a rollout.remote block is set "
                "(rollout=remote): add rollout/engine=remote (an experiment preset "
                "may pin the engine)",
            )
        cls.check_settings(rollout, world)

    @classmethod
    def _check_device(cls, name: str, rollout: Mapping[str, Any]) -> None:
        """`rollout.device` (or the engine node's own `device`) is one this engine samples on."""
        node, device, key = rollout["engine"], str(rollout.get("device", "cpu")), "rollout.device"
        if str(node.get("device", device)) != device:  # set on the engine node itself
            key, device = "rollout.engine.device", str(node.get("device"))
        if device.split(":")[0] not in cls.devices:
            raise ConfigError(
                key,
                f"is {device!r}, but rollout/engine={name} ({cls.__name__}) "
                f"samples on {' or '.join(d.upper() for d in cls.devices)} only: set "
                f"rollout.device={cls.devices[0]}, or pick an engine that samples "
                "there",
            )

    @classmethod
    def _check_lora(cls, name: str, model: Mapping[str, Any]) -> bool:
        """`model.lora`'s own rule, and an engine class that declares serves_lora for adapters;
        whether the policy has them."""
        from frlab.model.lora import check_lora, enabled

        lora = model.get("lora") or {}
        check_lora(lora)
        if not enabled(lora):
            return False
        if not cls.serves_lora:
            raise ConfigError(
                "model.lora.rank",
                f"the {name} engine ({cls.__name__}) does not declare "
                "serves_lora: serve the adapter with an engine that does, or set "
                "model.lora.rank=0",
            )
        return True

    @classmethod
    def check_settings(cls, rollout: Mapping[str, Any], world: int) -> None:
        """Raise ConfigError(key, reason) for a `rollout` setting this engine cannot honour
        with `world` learner ranks (preflight asks before anything is built); by default every
        setting is fine."""
        return None

    @classmethod
    def check_learner(cls, accelerator: str) -> None:
        """Raise ConfigError (its own key), or a ValueError that preflight keys as
        `rollout.engine`, when the engine cannot serve beside a learner on `accelerator`
        (`trainer.accelerator`); every placement is fine unless the engine says otherwise."""
        return None

    @classmethod
    def weight_updates(cls) -> tuple[str, ...]:
        """The `rollout.weight_update` modes this engine implements exactly, its default first
        (`WEIGHT_UPDATES`); an engine that does not say accepts only
        the default (null)."""
        return ()

    @property
    @abc.abstractmethod
    def version(self) -> int:
        """The current weight version (bumped by update_weights)."""

    @abc.abstractmethod
    def start(self) -> None:
        """Start background workers (idempotent)."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Stop, fail pending requests and join every thread this engine started."""

    @abc.abstractmethod
    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams
    ) -> GenerationResult:
        """Sample a continuation of `prompt_token_ids`; safe to call concurrently from one loop."""

    def generate_many(
        self, requests: Sequence[tuple[list[int], SamplingParams]]
    ) -> list[asyncio.Future[GenerationResult]]:
        """Submit several requests together, in this order; one future per request.

        Call it on the running event loop. An engine that batches (the torch engine) enqueues
        them atomically, so they start decoding together in this order whatever the thread
        timing; the default starts one `generate` task per request."""
        return [asyncio.ensure_future(self.generate(p, params)) for p, params in requests]

    @abc.abstractmethod
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Pause decoding, load `state_dict`, set the version to `version`, resume."""

    @abc.abstractmethod
    def pause(self) -> None:
        """Stop taking decode steps after the current one (requests stay queued)."""

    @abc.abstractmethod
    def resume(self) -> None:
        """Continue decoding after pause()."""

    def stats(self) -> dict[str, int]:
        """Engine counters and gauges for the pool's stats (none by default)."""
        return {}

    def down_reason(self) -> str | None:
        """Why this engine can serve nothing more (None: it can). Cheap and thread-safe: the
        pool asks it while it waits for a batch, and stops the run with `EngineDown`."""
        return None

    def outage(self) -> Outage | None:
        """Why this engine can serve nothing NOW but may again (None: it serves). Cheap and
        thread-safe: while it is set the pool admits no rollout (a circuit breaker) and
        requeues the prompts whose requests failed; `down_reason` ends it for good."""
        return None

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _options_that(options: Mapping[str, str], capability: str) -> list[str]:
    """The rollout/engine options (name -> `_target_`) whose engine class declares `capability`."""
    from hydra.utils import get_object

    owners = {name: get_object(target) for name, target in options.items()}
    return [
        name
        for name, owner in owners.items()
        if getattr(getattr(owner, "__self__", owner), capability, False)
    ]
