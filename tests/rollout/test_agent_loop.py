"""The agent loop: template once, token in/token out, masks, budgets, turn cap, truncation,
failures as RolloutError, env steps off the event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import random
import threading

import numpy as np
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from envs.base import Env, StepResult
from envs.toy import TOY_ENVS
from frlab.config.arguments import declared_defaults
from frlab.config.schema import RolloutConfig
from frlab.defaults import agent_loop_config, sampling_params, torch_engine
from frlab.errors import ConfigError
from frlab.model.toy_tokenizer import build_toy_tokenizer
from frlab.rollout.agent_loop import (
    AgentLoopConfig,
    RolloutError,
    observation_ids,
    run_episode,
    template_ids,
)
from frlab.rollout.engine import Engine, GenerationResult, SamplingParams
from frlab.rollout.env_threads import EnvThreads

TOK = build_toy_tokenizer()
EOS = TOK.eos_token_id


class ScriptedEngine(Engine):
    """Returns scripted token lists (cut at the budget or the first stop id), records calls."""

    def __init__(self, turns: list[list[int]], version: int = 3, fail: bool = False) -> None:
        self.turns, self._version, self.fail = list(turns), version, fail
        self.calls: list[tuple[list[int], SamplingParams]] = []

    @property
    def version(self) -> int:
        return self._version

    def start(self) -> None: ...
    def shutdown(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def update_weights(self, state_dict, version: int) -> None: ...

    async def generate(self, prompt_token_ids, params) -> GenerationResult:
        self.calls.append((list(prompt_token_ids), params))
        if self.fail:
            raise RuntimeError("backend exploded")
        tokens, reason = [], "length"
        for t in self.turns.pop(0)[: params.max_new_tokens]:
            tokens.append(t)
            if t in params.stop_token_ids:
                reason = "stop"
                break
        n = len(tokens)
        return GenerationResult(
            tokens, [-0.25 - 0.01 * i for i in range(n)], [self._version] * n, reason
        )


class ScriptedEnv(Env):
    """Observations "obs1", "obs2", ...; done after `done_after` steps with reward 1."""

    def __init__(self, done_after: int | None = 1, fail_on_step: int | None = None) -> None:
        self.done_after, self.fail_on_step = done_after, fail_on_step
        self.actions: list[str] = []
        self.threads: list[int] = []

    def sample_task(self, rng: random.Random) -> dict:
        return {"q": "hi"}

    def reset(self, task) -> list[dict[str, str]]:
        return [{"role": "user", "content": task["q"]}]

    def step(self, action_text: str) -> StepResult:
        self.threads.append(threading.get_ident())
        self.actions.append(action_text)
        n = len(self.actions)
        if n == self.fail_on_step:
            raise OSError("tool crashed")
        done = self.done_after is not None and n >= self.done_after
        return StepResult(
            None if done else f"obs{n}", 1.0 if done else 0.0, done, {"tool_calls": 1}
        )


def ids(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def run(engine, env, cfg, **kw):
    return asyncio.run(
        run_episode(engine, env, {"q": "hi"}, TOK, cfg, prompt_id=kw.pop("prompt_id", 9), **kw)
    )


def test_single_turn_layout_is_prompt_then_sampled_tokens() -> None:
    prompt = template_ids(TOK, [{"role": "user", "content": "hi"}])
    assert prompt == ids("<|user|>hi<|end|><|assistant|>")
    engine = ScriptedEngine([ids("42") + [EOS]])
    traj = run(engine, ScriptedEnv(done_after=1), agent_loop_config(max_turns=1, max_len=64))
    assert traj.token_ids == prompt + ids("42") + [EOS]
    assert traj.action_mask == [False] * len(prompt) + [True] * 3
    assert traj.behavior_log_probs[len(prompt) :] == pytest.approx([-0.25, -0.26, -0.27])
    assert traj.behavior_log_probs[: len(prompt)] == [0.0] * len(prompt)
    assert traj.token_versions == [-1] * len(prompt) + [3] * 3
    assert traj.turn_boundaries == [len(prompt)]
    assert (traj.reward, traj.failure, traj.truncated, traj.prompt_id) == (1.0, False, False, 9)
    assert traj.info["turns"] == 1 and traj.info["tool_calls"] == 1
    assert traj.info["finish_reasons"] == ["stop"]


def test_multi_turn_masks_observations_and_keeps_sampled_ids_verbatim() -> None:
    turn1, turn2 = ids("ab") + [EOS], ids("c")  # turn 2 is cut by its budget: no end token
    engine = ScriptedEngine([turn1, turn2 + ids("zz")])
    env = ScriptedEnv(done_after=2)
    cfg = agent_loop_config(max_turns=2, max_len=64, sampling=sampling_params(max_new_tokens=3))
    traj = run(engine, env, cfg)
    prompt = template_ids(TOK, [{"role": "user", "content": "hi"}])
    obs = ids("<|user|>obs1<|end|><|assistant|>")  # the sampled <|end|> already closed turn 1
    expected = prompt + turn1 + obs + ids("c") + ids("zz")[:2]
    assert traj.token_ids == expected
    mask = [False] * len(prompt) + [True] * 3 + [False] * len(obs) + [True] * 3
    assert traj.action_mask == mask
    assert traj.turn_boundaries == [len(prompt), len(prompt) + 3 + len(obs)]
    # the second request continues the exact token stream of the first (no re-tokenisation)
    assert engine.calls[1][0] == prompt + turn1 + obs
    assert env.actions == ["ab", "czz"]
    assert traj.info["turns"] == 2 and traj.info["tool_calls"] == 2 and not traj.truncated


def test_observation_after_a_length_cut_closes_the_assistant_turn() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    assert observation_ids(TOK, msgs, "obs", ids("ab")) == ids(
        "<|end|><|user|>obs<|end|><|assistant|>"
    )
    assert observation_ids(TOK, msgs, "obs", ids("ab") + [EOS]) == ids(
        "<|user|>obs<|end|><|assistant|>"
    )


def test_observation_pieces_follow_a_chatml_template() -> None:
    chatml = copy.deepcopy(TOK)
    chatml.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    chatml.chat_template = (
        "{% for m in messages %}"
        "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    im_end = chatml.convert_tokens_to_ids("<|im_end|>")
    msgs = [{"role": "user", "content": "q"}]
    got = observation_ids(chatml, msgs, "out", [5, im_end], role="tool")
    assert got == chatml.encode(
        "\n<|im_start|>tool\nout<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )


def test_per_turn_budget_is_min_of_max_new_tokens_and_room_left() -> None:
    prompt_len = len(template_ids(TOK, [{"role": "user", "content": "hi"}]))
    obs_len = len(ids("<|end|><|user|>obs1<|end|><|assistant|>"))
    max_len = prompt_len + 4 + obs_len + 2
    engine = ScriptedEngine([ids("abcd"), ids("efgh")])
    cfg = agent_loop_config(
        max_turns=5, max_len=max_len, sampling=sampling_params(max_new_tokens=4)
    )
    traj = run(engine, ScriptedEnv(done_after=None), cfg)
    assert [c[1].max_new_tokens for c in engine.calls] == [4, 2]
    assert len(traj.token_ids) == max_len and traj.truncated and traj.info["turns"] == 2
    assert EOS in engine.calls[0][1].stop_token_ids  # the turn ends on the tokenizer's eos


def test_observation_that_leaves_no_room_ends_the_episode_truncated() -> None:
    prompt_len = len(template_ids(TOK, [{"role": "user", "content": "hi"}]))
    engine = ScriptedEngine([ids("ab"), ids("cd")])
    cfg = agent_loop_config(
        max_turns=5, max_len=prompt_len + 4, sampling=sampling_params(max_new_tokens=2)
    )
    traj = run(engine, ScriptedEnv(done_after=None), cfg)
    assert len(engine.calls) == 1 and traj.truncated
    assert len(traj.token_ids) == prompt_len + 2  # no dangling observation tokens


def test_turn_cap_truncates_an_unfinished_episode() -> None:
    engine = ScriptedEngine([ids("a"), ids("b"), ids("c"), ids("d")])
    env = ScriptedEnv(done_after=None)
    traj = run(engine, env, agent_loop_config(max_turns=3, max_len=200))
    assert traj.info["turns"] == 3 and len(env.actions) == 3 and traj.truncated
    assert traj.reward == 0.0 and traj.failure  # default failure label: reward <= 0


def test_episode_done_on_the_last_allowed_turn_is_not_truncated() -> None:
    traj = run(
        ScriptedEngine([ids("a"), ids("b")]),
        ScriptedEnv(done_after=2),
        agent_loop_config(max_turns=2),
    )
    assert not traj.truncated and traj.reward == 1.0


def test_zero_action_tokens_are_rejected_with_a_reason() -> None:
    prompt_len = len(template_ids(TOK, [{"role": "user", "content": "hi"}]))
    engine = ScriptedEngine([ids("a")])
    with pytest.raises(RolloutError) as err:
        run(engine, ScriptedEnv(), agent_loop_config(max_len=prompt_len))
    assert err.value.reason == "zero_action_tokens" and engine.calls == []


@pytest.mark.parametrize(
    ("engine", "env", "reason"),
    [
        (ScriptedEngine([], fail=True), ScriptedEnv(), "engine"),
        (ScriptedEngine([[7]]), ScriptedEnv(fail_on_step=1), "env_step"),
    ],
)
def test_failures_raise_rollout_error_with_reason(engine, env, reason: str) -> None:
    with pytest.raises(RolloutError) as err:
        run(engine, env, agent_loop_config())
    assert err.value.reason == reason


def test_env_reset_failure_is_a_rollout_error() -> None:
    class BadReset(ScriptedEnv):
        def reset(self, task):
            raise KeyError("no such task")

    with pytest.raises(RolloutError) as err:
        run(ScriptedEngine([[7]]), BadReset(), agent_loop_config())
    assert err.value.reason == "env_reset"


def test_env_steps_run_off_the_event_loop_in_the_given_executor() -> None:
    env = ScriptedEnv(done_after=2)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="envpool") as pool:
        names: list[str] = []
        real_step = env.step

        def step(text: str) -> StepResult:
            names.append(threading.current_thread().name)
            return real_step(text)

        env.step = step
        run(ScriptedEngine([[7], [8]]), env, agent_loop_config(max_turns=2), executor=pool)
    assert names and all(n.startswith("envpool") for n in names)
    assert threading.get_ident() not in env.threads


def test_config_rejects_bad_limits() -> None:
    with pytest.raises(ValueError, match="max_turns"):
        agent_loop_config(max_turns=0)
    with pytest.raises(ValueError, match="max_len"):
        agent_loop_config(max_len=1)
    for key in ("env_timeout_s", "engine_timeout_s"):
        for bad in (0, -1.0, float("inf"), "60", True):
            with pytest.raises(ValueError, match=f"rollout.{key}"):
                agent_loop_config(**{key: bad})


def test_agent_loop_config_from_a_rollout_node_carries_the_deadlines() -> None:
    sampling = {"temperature": 0.5, "top_p": 1.0, "top_k": 0, "max_new_tokens": 8}
    node = declared_defaults(
        RolloutConfig,
        max_turns=3,
        max_len=40,
        env_timeout_s=60,
        engine_timeout_s=90.5,
        adaptive_deadlines=False,
        sampling=sampling,
    )
    cfg = AgentLoopConfig.from_rollout(node)
    assert not cfg.deadlines.env.adaptive
    assert (cfg.max_turns, cfg.max_len, cfg.env_timeout_s, cfg.engine_timeout_s) == (
        3,
        40,
        60.0,
        90.5,
    )
    assert cfg.sampling.temperature == 0.5 and cfg.sampling.max_new_tokens == 8
    del node["engine_timeout_floor_s"]
    with pytest.raises(ConfigError, match="rollout.engine_timeout_floor_s"):
        AgentLoopConfig.from_rollout(node)


class HangingEnv(ScriptedEnv):
    """Blocks in `hang_in` ("reset" or "step") until `release` is set."""

    def __init__(self, hang_in: str) -> None:
        super().__init__()
        self.hang_in, self.release = hang_in, threading.Event()

    def reset(self, task):
        if self.hang_in == "reset":
            self.release.wait()
        return super().reset(task)

    def step(self, action_text: str) -> StepResult:
        if self.hang_in == "step":
            self.release.wait()
        return super().step(action_text)


@pytest.mark.parametrize("hang_in", ["reset", "step"])
def test_a_hung_env_call_fails_the_rollout_at_its_deadline(hang_in: str) -> None:
    env = HangingEnv(hang_in)
    threads = EnvThreads(1)
    try:
        with pytest.raises(RolloutError) as err:
            run(ScriptedEngine([[7]]), env, agent_loop_config(env_timeout_s=0.1), executor=threads)
        assert err.value.reason == f"env_{hang_in}_timeout" and "0.1 s" in str(err.value)
        assert threads.abandoned == 1
    finally:
        env.release.set()
        threads.shutdown()


def test_a_hung_engine_request_fails_the_rollout_and_is_cancelled() -> None:
    cancelled = threading.Event()

    class HungEngine(ScriptedEngine):
        async def generate(self, prompt_token_ids, params):
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise

    with pytest.raises(RolloutError) as err:
        run(HungEngine([]), ScriptedEnv(), agent_loop_config(engine_timeout_s=0.1))
    assert err.value.reason == "engine_timeout" and cancelled.is_set()


@pytest.mark.parametrize("reward", ["1", b"1", None, [1.0], {"r": 1}])
def test_a_reward_that_is_not_a_real_number_fails_the_rollout(reward) -> None:
    class OddReward(ScriptedEnv):
        def step(self, action_text: str) -> StepResult:
            return StepResult(None, reward, True)

    with pytest.raises(RolloutError) as err:
        run(ScriptedEngine([[7]]), OddReward(), agent_loop_config())
    assert err.value.reason == "bad_reward" and repr(reward) in str(err.value)


@pytest.mark.parametrize(
    ("reward", "expected"),
    [(True, 1.0), (0, 0.0), (0.25, 0.25), (np.float32(0.5), 0.5), (np.int64(2), 2.0)],
)
def test_bool_int_float_and_numpy_rewards_are_accepted(reward, expected: float) -> None:
    class Reward(ScriptedEnv):
        def step(self, action_text: str) -> StepResult:
            return StepResult(None, reward, True)

    traj = run(ScriptedEngine([[7]]), Reward(), agent_loop_config())
    assert traj.reward == expected and type(traj.reward) is float


def test_toy_multi_episode_with_the_torch_engine_is_consistent() -> None:
    """End to end: real engine, real toy env; the stream re-scores to the recorded log-probs."""
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
        )
    ).eval()
    env = TOY_ENVS["toy_multi"]()
    task = TOY_ENVS["toy_multi"].task_sampler().sample(random.Random(0))
    cfg = agent_loop_config(max_turns=2, max_len=48, sampling=sampling_params(max_new_tokens=3))
    with torch_engine(model, seed=0) as engine:
        traj = asyncio.run(run_episode(engine, env, task, TOK, cfg, prompt_id=1))
    assert traj.info["turns"] == 2 and not traj.truncated
    assert f"key {task['key']}" in TOK.decode(
        [t for t, a in zip(traj.token_ids, traj.action_mask, strict=True) if not a]
    )
    with torch.no_grad():
        logp = torch.log_softmax(
            model(input_ids=torch.tensor([traj.token_ids])).logits[0].float(), -1
        )
    for t, active in enumerate(traj.action_mask):
        if active:
            assert abs(logp[t - 1, traj.token_ids[t]].item() - traj.behavior_log_probs[t]) < 1e-4
