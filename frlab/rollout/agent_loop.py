"""The multi-turn agent loop: one environment episode -> one `Trajectory` (token in, token out).

The chat template is applied ONCE, to the environment's initial messages (with the env's
`system_prompt` setting: frlab.rollout.chat). Each turn then
samples from the engine with the per-turn budget min(max_new_tokens, max_len - used), appends
the sampled ids verbatim (action mask True, with the engine's own log-probs and weight
versions: FlashREINFORCE's behaviour log-probs, paper Sec. 3), steps the environment off the
event loop, and appends the observation as a chat turn whose text is encoded on its own with
the template's turn pieces (action mask False). Earlier tokens are never decoded and
re-encoded, so the learner scores exactly the tokens the sampler produced.

With a rollout `seed`, turn t's request carries `turn_seed(seed, t)` (frlab.rollout.seeding).

An episode that ends on the turn cap or the length budget before the environment says done
is marked truncated.

MoE routing replay: when the engine returns `GenerationResult.routing`, the trajectory keeps,
for every position, the experts of the LATEST engine call that forwarded it (each call
re-forwards the whole stream, so later calls overwrite earlier positions).

Deadlines: every environment call (`reset`, `step`) runs on `EnvThreads` under
`env_timeout_s` and every engine request under `engine_timeout_s`; a call past its deadline
fails the rollout (`env_reset_timeout`, `env_step_timeout`, `engine_timeout`) and a hung
environment thread is abandoned (frlab.rollout.env_threads). A failing environment step or
engine request, or a reward that is not a real number (bool, int, float), raises
`RolloutError`, which the rollout pool counts by `reason` (it fails that rollout, not the run).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import numbers
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from envs.base import Env, StepResult
from frlab.data.batch import Trajectory, TrajectoryError
from frlab.errors import ConfigError
from frlab.rollout.chat import template_ids, with_system_prompt
from frlab.rollout.deadlines import AdaptiveDeadline, Deadlines
from frlab.rollout.engine import Engine, GenerationResult, SamplingParams
from frlab.rollout.env_threads import (
    DeadlineExceeded,
    EnvThreads,
    call_with_deadline,
    check_deadline,
)
from frlab.rollout.seeding import turn_seed

# the rollout keys of an episode's deadlines (AgentLoopConfig's fields of the same names)
DEADLINE_KEYS = (
    "env_timeout_s",
    "engine_timeout_s",
    "adaptive_deadlines",
    "env_timeout_floor_s",
    "engine_timeout_floor_s",
)
_ACTION_SENTINEL = "FRLABACTIONSENTINEL"
_OBSERVATION_SENTINEL = "FRLABOBSERVATIONSENTINEL"


class RolloutError(RuntimeError):
    """One rollout failed; `reason` is a short countable label (e.g. "env_step", "engine")."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass
class AgentLoopConfig:
    """Episode limits: turn cap, total token budget (prompt + all turns), per-turn sampling,
    and the deadlines of one environment call and one engine request (seconds). The fields
    are `rollout` keys (declared in frlab.config.schema.RolloutConfig, defaults there): build
    it with `from_rollout` from a resolved node, or from `declared_defaults(RolloutConfig)`."""

    max_turns: int
    max_len: int
    sampling: SamplingParams
    env_timeout_s: float
    engine_timeout_s: float
    adaptive_deadlines: bool
    env_timeout_floor_s: float
    engine_timeout_floor_s: float
    observation_role: str = "user"
    deadlines: Deadlines = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if int(self.max_turns) < 1:
            raise ConfigError("rollout.max_turns", f"must be >= 1, got {self.max_turns}")
        if int(self.max_len) < 2:
            raise ConfigError("rollout.max_len", f"must be >= 2, got {self.max_len}")
        if not isinstance(self.sampling, SamplingParams):
            raise TypeError(f"rollout.sampling must be SamplingParams, got {type(self.sampling)}")
        self.env_timeout_s = check_deadline("rollout.env_timeout_s", self.env_timeout_s)
        self.engine_timeout_s = check_deadline("rollout.engine_timeout_s", self.engine_timeout_s)
        floors = [
            check_deadline(f"rollout.{k}", getattr(self, k))
            for k in ("env_timeout_floor_s", "engine_timeout_floor_s")
        ]
        adaptive = bool(self.adaptive_deadlines)
        self.deadlines = Deadlines(
            AdaptiveDeadline(self.env_timeout_s, floors[0], adaptive),
            AdaptiveDeadline(self.engine_timeout_s, floors[1], adaptive),
        )

    @classmethod
    def from_rollout(cls, rollout: Mapping[str, Any]) -> AgentLoopConfig:
        """The agent-loop settings of a resolved `rollout` config node (ConfigError naming a
        missing key)."""
        keys = ("max_turns", "max_len", "sampling", *DEADLINE_KEYS)
        missing = [key for key in keys if key not in rollout]
        if missing:
            raise ConfigError(f"rollout.{missing[0]}", "is missing")
        return cls(
            max_turns=rollout["max_turns"],
            max_len=rollout["max_len"],
            sampling=SamplingParams.from_mapping(rollout["sampling"]),
            **{key: rollout[key] for key in DEADLINE_KEYS},
        )


@dataclass
class _Stream:
    """The growing token stream of one episode."""

    token_ids: list[int] = field(default_factory=list)
    action_mask: list[bool] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    routing: torch.Tensor | None = None  # [n, L, k] experts of the latest call per position
    routing_missing: bool = False  # some engine call returned no routing

    def add_context(self, ids: list[int]) -> None:
        self.token_ids += ids
        self.action_mask += [False] * len(ids)
        self.log_probs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)

    def add_action(self, gen: GenerationResult) -> None:
        self.token_ids += gen.token_ids
        self.action_mask += [True] * len(gen.token_ids)
        self.log_probs += gen.log_probs
        self.versions += gen.versions
        self._add_routing(gen.routing)

    def _add_routing(self, routing: torch.Tensor | None) -> None:
        """Overwrite the positions this call forwarded (a prefix of the stream)."""
        if routing is None:
            self.routing_missing = True
            return
        old = self.routing
        if old is not None and old.shape[0] > routing.shape[0]:
            routing = torch.cat([routing, old[routing.shape[0] :]], dim=0)
        self.routing = routing

    def final_routing(self) -> torch.Tensor | None:
        """The recorded routing when every engine call returned one, else None."""
        return None if self.routing_missing else self.routing


def observation_ids(
    tokenizer: Any,
    messages: list[dict[str, str]],
    observation: str,
    last_action_ids: list[int],
    role: str = "user",
) -> list[int]:
    """Ids that close the assistant turn, add `observation` as a `role` turn and reopen the
    assistant turn, rendered from the template's own pieces (found with sentinel messages).
    If the action already ended with the template's end-of-turn text, it is not repeated."""
    convo = [
        *messages,
        {"role": "assistant", "content": _ACTION_SENTINEL},
        {"role": role, "content": _OBSERVATION_SENTINEL},
    ]
    text = tokenizer.apply_chat_template(convo, add_generation_prompt=True, tokenize=False)
    a_end = text.find(_ACTION_SENTINEL) + len(_ACTION_SENTINEL)
    o_start = text.find(_OBSERVATION_SENTINEL, a_end)
    if a_end < len(_ACTION_SENTINEL) or o_start < 0:
        raise RolloutError("chat_template", "the template drops assistant or observation content")
    between, after = text[a_end:o_start], text[o_start + len(_OBSERVATION_SENTINEL) :]
    if last_action_ids:
        last_text = tokenizer.decode(last_action_ids[-1:], skip_special_tokens=False)
        if last_text and between.startswith(last_text):
            between = between[len(last_text) :]
    return list(tokenizer.encode(between + observation + after, add_special_tokens=False))


_SHARED: EnvThreads | None = None
_SHARED_LOCK = threading.Lock()


def shared_env_threads() -> EnvThreads:
    """The process-wide EnvThreads for callers that bring none (evaluation episodes)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = EnvThreads(32, name="frlab-env-shared")
        return _SHARED


async def env_call(
    executor: concurrent.futures.Executor | None,
    deadline: AdaptiveDeadline | float,
    reason: str,
    fn: Callable[..., Any],
    *args: Any,
) -> Any:
    """`fn(*args)` off the event loop under a deadline (an adaptive one learns from the
    calls that return); a call past it raises RolloutError(f"{reason}_timeout"), any other
    failure RolloutError(reason)."""
    adaptive = isinstance(deadline, AdaptiveDeadline)
    try:
        return await call_with_deadline(
            executor or shared_env_threads(),
            deadline.current() if adaptive else deadline,
            reason,
            fn,
            *args,
            observe=deadline.observe if adaptive else None,
        )
    except DeadlineExceeded as exc:
        raise RolloutError(f"{reason}_timeout", str(exc)) from exc
    except Exception as exc:
        raise RolloutError(reason, repr(exc)) from exc


async def _generate(
    engine: Engine, ids: list[int], params: SamplingParams, deadline: AdaptiveDeadline
) -> Any:
    deadline_s, started = deadline.current(), time.monotonic()
    try:
        out = await asyncio.wait_for(engine.generate(ids, params), deadline_s)
        deadline.observe(time.monotonic() - started)
        return out
    except TimeoutError as exc:
        detail = f"engine request did not return within {deadline_s:g} s"
        raise RolloutError("engine_timeout", detail) from exc
    except Exception as exc:
        raise RolloutError("engine", repr(exc)) from exc


def check_reward(value: Any) -> float:
    """A step reward as float: a real number (bool, int, float, numpy scalar), else
    RolloutError("bad_reward") (a string "1" is not a reward)."""
    if isinstance(value, str | bytes) or not isinstance(value, numbers.Real):
        raise RolloutError(
            "bad_reward", f"step reward must be a real number (bool, int, float), got {value!r}"
        )
    return float(value)


async def run_episode(
    engine: Engine,
    env: Env,
    task: Mapping[str, Any],
    tokenizer: Any,
    cfg: AgentLoopConfig,
    *,
    prompt_id: int,
    executor: concurrent.futures.Executor | None = None,
    seed: int | None = None,
) -> Trajectory:
    """Play one episode of `env` on `task` with `engine`; return its finished trajectory.
    Environment calls run on `executor` (default: a shared EnvThreads). `seed`: the rollout's
    sampling seed (None: the engine's own random stream)."""
    prompt, messages = await _reset(env, task, tokenizer, executor, cfg.deadlines.env)
    stop_ids = _stop_ids(tokenizer, cfg.sampling)
    stream, boundaries, finish, tool_calls = _Stream(), [], [], 0
    stream.add_context(prompt)
    reward, done, info = 0.0, False, {}
    while len(boundaries) < cfg.max_turns:
        budget = min(cfg.sampling.max_new_tokens, cfg.max_len - len(stream.token_ids))
        if budget < 1:
            break
        turn = None if seed is None else turn_seed(seed, len(boundaries))
        params = _turn_params(cfg.sampling, budget, stop_ids, turn)
        gen = await _generate(engine, list(stream.token_ids), params, cfg.deadlines.engine)
        boundaries.append(len(stream.token_ids))
        stream.add_action(gen)
        finish.append(gen.finish_reason)
        action_text = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        step = await _step(env, action_text, executor, cfg.deadlines.env)
        reward, info = reward + check_reward(step.reward), dict(step.info)
        tool_calls += int(info.get("tool_calls", 0) or 0)
        done = bool(step.done)
        if done or len(boundaries) >= cfg.max_turns:
            break
        obs = observation_ids(
            tokenizer, list(messages), step.observation or "", gen.token_ids, cfg.observation_role
        )
        if len(stream.token_ids) + len(obs) >= cfg.max_len:
            break  # no room left for another action token
        stream.add_context(obs)
    if not any(stream.action_mask):
        raise RolloutError(
            "zero_action_tokens", f"prompt of {len(prompt)} tokens, max_len {cfg.max_len}"
        )
    episode_info = {
        "turns": len(boundaries),
        "tool_calls": tool_calls,
        "finish_reasons": finish,
        "response_tokens": sum(stream.action_mask),
        "env": info,
    }
    return _trajectory(stream, env, boundaries, reward, done, prompt_id, episode_info)


async def _reset(
    env: Env,
    task: Mapping[str, Any],
    tokenizer: Any,
    executor: concurrent.futures.Executor | None,
    deadline: AdaptiveDeadline,
) -> tuple[list[int], list[dict[str, str]]]:
    """Reset `env` and apply the chat template once, so later turns append ids, never re-encode."""
    messages = await env_call(executor, deadline, "env_reset", env.reset, task)
    system_prompt = getattr(env, "system_prompt", "default")
    try:
        prompt = template_ids(tokenizer, list(messages), system_prompt)
        messages = with_system_prompt(list(messages), system_prompt)
    except Exception as exc:
        raise RolloutError("chat_template", repr(exc)) from exc
    return prompt, messages


def _trajectory(
    stream: _Stream,
    env: Env,
    boundaries: list[int],
    reward: float,
    done: bool,
    prompt_id: int,
    episode_info: dict[str, Any],
) -> Trajectory:
    """The finished episode as a Trajectory; a malformed one fails this rollout, not the run."""
    try:
        return Trajectory(
            token_ids=stream.token_ids,
            action_mask=stream.action_mask,
            behavior_log_probs=stream.log_probs,
            token_versions=stream.versions,
            reward=reward,
            prompt_id=int(prompt_id),
            failure=bool(env.failure(reward)),
            truncated=not done,
            turn_boundaries=boundaries,
            info=episode_info,
            routing=stream.final_routing(),
        )
    except TrajectoryError as exc:
        raise RolloutError("bad_trajectory", str(exc)) from exc


async def _step(
    env: Env,
    action_text: str,
    executor: concurrent.futures.Executor | None,
    deadline: AdaptiveDeadline,
) -> StepResult:
    step = await env_call(executor, deadline, "env_step", env.step, action_text)
    if not isinstance(step, StepResult):
        raise RolloutError("env_step", f"step returned {type(step).__name__}, not StepResult")
    return step


def _stop_ids(tokenizer: Any, sampling: SamplingParams) -> tuple[int, ...]:
    """The configured stop ids plus the tokenizer's eos (the end of an assistant turn)."""
    ids = list(sampling.stop_token_ids)
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None and eos not in ids:
        ids.append(int(eos))
    return tuple(ids)


def _turn_params(
    sampling: SamplingParams, budget: int, stop_ids: tuple[int, ...], seed: int | None
) -> SamplingParams:
    seed = sampling.seed if seed is None else seed
    return dataclasses.replace(
        sampling, max_new_tokens=int(budget), stop_token_ids=stop_ids, seed=seed
    )
