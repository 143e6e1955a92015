"""Toy environments: hand-written answers get the right rewards, tasks validate, the random
policy rarely succeeds, and the multi-turn answer depends on the observation."""

from __future__ import annotations

import random

import pytest

from envs.base import Env, StepResult
from envs.toy import TOY_ENVS, KeyParityEnv, ParityEnv
from envs.toy.grading import first_digit, same_parity
from frlab.model.toy_tokenizer import build_toy_tokenizer


def test_registry_names() -> None:
    assert TOY_ENVS == {"toy_single": ParityEnv, "toy_multi": KeyParityEnv}
    assert all(issubclass(cls, Env) for cls in TOY_ENVS.values())


@pytest.mark.parametrize(
    ("text", "digit"),
    [("7", 7), (" 3y9", 3), ("x 3", None), ("no digits", None), ("", None), (" ", None)],
)
def test_first_digit(text: str, digit: int | None) -> None:
    assert first_digit(text) == digit


@pytest.mark.parametrize(
    ("digits", "answer", "reward"),
    [
        ([3, 8], "4", 1.0),
        ([3, 8], "0 please", 1.0),
        ([3, 8], "5", 0.0),
        ([3, 7], "9", 1.0),
        ([3, 7], "the answer is 2", 0.0),
        ([5], "odd", 0.0),
        ([0], "6", 1.0),
    ],
)
def test_single_rewards_hand_written_answers(digits: list[int], answer: str, reward: float) -> None:
    env = ParityEnv(num_digits=len(digits))
    messages = env.reset({"digits": digits})
    assert messages == [{"role": "user", "content": "parity: " + " ".join(map(str, digits))}]
    step = env.step(answer)
    assert isinstance(step, StepResult)
    assert (step.reward, step.done, step.observation) == (reward, True, None)
    assert env.failure(step.reward) == (reward == 0.0)


def test_single_step_without_reset_raises() -> None:
    env = ParityEnv()
    with pytest.raises(RuntimeError, match="reset"):
        env.step("1")
    env.reset({"digits": [1, 2]})
    env.step("2")
    with pytest.raises(RuntimeError, match="reset"):
        env.step("2")


def test_multi_turn_answer_needs_the_observation() -> None:
    env = KeyParityEnv(num_decoys=2)
    messages = env.reset({"key": 7, "decoys": [4, 2]})
    assert messages == [{"role": "user", "content": "key? 4 2"}]
    first = env.step("what is the key?")
    assert (first.observation, first.reward, first.done) == ("key 7", 0.0, False)
    second = env.step("3")
    assert (second.reward, second.done) == (1.0, True)
    env.reset({"key": 6, "decoys": [4, 2]})
    assert env.step("1").observation == "key 6"
    assert env.step("3").reward == 0.0  # same prompt, different key: the observation decides


def test_multi_turn_default_prompt_has_no_digits() -> None:
    env = KeyParityEnv()
    task = KeyParityEnv.task_sampler().sample(random.Random(0))
    assert env.reset(task) == [{"role": "user", "content": "key?"}]


@pytest.mark.parametrize(
    ("cls", "task", "field"),
    [
        (ParityEnv, {}, "digits"),
        (ParityEnv, {"digits": []}, "digits"),
        (ParityEnv, {"digits": [1, 12]}, "digits"),
        (ParityEnv, {"digits": ["3"]}, "digits"),
        (KeyParityEnv, {"decoys": [1]}, "key"),
        (KeyParityEnv, {"key": True}, "key"),
        (KeyParityEnv, {"key": 3, "decoys": [10]}, "decoys"),
    ],
)
def test_bad_tasks_name_the_field(cls, task: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        cls().reset(task)


def test_bad_constructor_arguments() -> None:
    with pytest.raises(ValueError, match="num_digits"):
        ParityEnv(num_digits=0)
    with pytest.raises(ValueError, match="num_decoys"):
        KeyParityEnv(num_decoys=-1)
    with pytest.raises(ValueError, match="num_digits"):
        ParityEnv.task_sampler(num_digits=0)
    with pytest.raises(ValueError, match="num_decoys"):
        KeyParityEnv.task_sampler(num_decoys=-1)
    with pytest.raises(TypeError, match="num_digit"):
        ParityEnv.task_sampler(num_digit=3)  # a misspelt argument, as the env itself


def test_single_prompts_vary() -> None:
    env, tasks, rng = ParityEnv(), ParityEnv.task_sampler(), random.Random(0)
    prompts = {env.reset(tasks.sample(rng))[0]["content"] for _ in range(300)}
    assert len(prompts) >= 80  # 100 distinct two-digit prompts


@pytest.mark.parametrize("name", ["toy_single", "toy_multi"])
def test_a_uniform_one_token_reply_rarely_succeeds(name: str) -> None:
    """Reward of every single-token reply over the toy vocabulary: a random policy's success
    rate is the fraction of rewarded tokens, 5 of ~60 (the five digits of the right parity)."""
    tok = build_toy_tokenizer()
    env, tasks, rng = TOY_ENVS[name](), TOY_ENVS[name].task_sampler(), random.Random(1)
    rewarded, total = 0, 0
    for _ in range(5):
        task = tasks.sample(rng)
        for token_id in range(len(tok)):
            env.reset(task)
            step = env.step("") if name == "toy_multi" else None  # turn 1 reveals the key
            assert step is None or not step.done
            rewarded += env.step(tok.decode([token_id], skip_special_tokens=True)).reward
            total += 1
    assert rewarded / total == pytest.approx(5 / len(tok))
    assert rewarded / total <= 0.1


def test_same_parity() -> None:
    assert same_parity("8", 2) and same_parity(" 1x", 9) and not same_parity("1", 2)
    assert not same_parity("none", 2) and not same_parity("x8", 2)


def test_faulty_parity_env_faults_follow_the_task_not_the_timing() -> None:
    import threading

    from envs.toy import FaultyParityEnv

    env = FaultyParityEnv(hang_every=10, raise_every=10, bad_reward_every=10, hang_s=0.01)
    kinds = {}
    for n in (120, 121, 122, 123):
        env.reset({"digits": [int(c) for c in f"{n:03d}"]})
        kinds[n] = env.fault()
    assert kinds == {120: "hang", 121: "raise", 122: "bad_reward", 123: None}
    env.reset({"digits": [1, 2, 1]})
    with pytest.raises(RuntimeError, match="injected failure on task 121"):
        env.step("1")
    env.reset({"digits": [1, 2, 2]})
    assert env.step("2").reward == "1.0"  # a string: the agent loop must refuse it
    env.reset({"digits": [1, 2, 0]})
    stepper = threading.Thread(target=env.step, args=("0",))
    stepper.start()
    stepper.join(60)
    assert not stepper.is_alive()  # hang_s bounds the injected hang
    env.reset({"digits": [1, 2, 3]})
    assert env.step("5").reward == 1.0
    with pytest.raises(ValueError, match="env.hang_every"):
        FaultyParityEnv(hang_every=-1)
