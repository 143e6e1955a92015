"""EpisodeEvaluation: exact avg@k over k episodes per task, failures counted, fresh envs."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from typing import Any

import pytest

from envs.base import Env, StepResult
from frlab.defaults import episode_evaluation
from frlab.evaluation.episodes import EpisodeEvaluation, list_tasks
from frlab.model.toy_tokenizer import build_toy_tokenizer
from frlab.rollout.engine import GenerationResult, SamplingParams

# The engine's reply per question; "coin" alternates right / wrong / right / ...
REPLY = {"sky": ["blue"], "grass": ["green"], "coin": ["heads", "tails"], "snow": ["red"]}
TASKS = [
    {"question": q, "answer": a}
    for q, a in (("sky", "blue"), ("grass", "green"), ("coin", "heads"), ("snow", "white"))
]


class EchoEngine:
    """Answers each question from REPLY (cycling per question), one turn, then eos."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.asked = tokenizer, {}
        self.params: list[SamplingParams] = []

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationResult:
        await asyncio.sleep(0)
        self.params.append(params)
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=True)
        question = next(q for q in REPLY if q in text)
        n = self.asked[question] = self.asked.get(question, 0) + 1
        reply = REPLY[question][(n - 1) % len(REPLY[question])]
        ids = [*self.tokenizer.encode(reply, add_special_tokens=False), self.tokenizer.eos_token_id]
        return GenerationResult(ids, [-0.5] * len(ids), [3] * len(ids), "stop")


class QuizEnv(Env):
    """One-turn quiz: reward 1 for the exact answer; "boom" questions fail at reset."""

    made: list[QuizEnv] = []

    def __init__(self, tasks: list[dict[str, str]]) -> None:
        self.tasks, self.closed, self.task = list(tasks), False, None
        QuizEnv.made.append(self)

    def reset(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        if task["question"] == "boom":
            raise RuntimeError("broken task")
        self.task = dict(task)
        return [{"role": "user", "content": task["question"]}]

    def step(self, action_text: str) -> StepResult:
        assert self.task is not None
        return StepResult(None, float(action_text.strip() == self.task["answer"]), True)

    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        return dict(rng.choice(self.tasks))

    def close(self) -> None:
        self.closed = True


def make(tasks: list[dict[str, str]], **kwargs: Any) -> EpisodeEvaluation:
    return episode_evaluation(
        {"quiz": lambda: QuizEnv(tasks)},
        max_turns=2,
        max_len=64,
        **{"k": 4, "every_n_steps": 1, **kwargs},
    )


def test_avg_at_k_is_the_mean_reward_over_k_episodes_per_task() -> None:
    QuizEnv.made.clear()
    tokenizer = build_toy_tokenizer()
    engine = EchoEngine(tokenizer)
    cb = make(TASKS, top_p=0.9, temperature=0.5, max_new_tokens=8, concurrency=3)
    metrics = cb.evaluate(engine, tokenizer)
    assert metrics == {
        "eval/quiz/avg@4": 0.625,  # (1 + 1 + 2/4 + 0) / 4
        "eval/quiz/errors": 0.0,
        "eval/mean/avg@4": 0.625,
    }
    assert engine.asked == {"sky": 4, "grass": 4, "coin": 4, "snow": 4}
    assert {(p.temperature, p.top_p, p.max_new_tokens) for p in engine.params} == {(0.5, 0.9, 8)}
    # one env to list the tasks, then a fresh env per episode; every one closed
    assert len(QuizEnv.made) == 1 + 16 and all(env.closed for env in QuizEnv.made)


def test_failed_episodes_score_zero_and_are_counted() -> None:
    tokenizer = build_toy_tokenizer()
    tasks = [*TASKS[:2], {"question": "boom", "answer": "x"}]
    metrics = make(tasks, k=2, limit=3).evaluate(EchoEngine(tokenizer), tokenizer)
    assert metrics["eval/quiz/avg@2"] == pytest.approx(2 / 3)
    assert metrics["eval/quiz/errors"] == 2.0


def test_limit_keeps_the_first_tasks_and_games_are_listed_in_order(tmp_path) -> None:
    assert [t["question"] for t in make(TASKS, limit=2).tasks("quiz")] == ["sky", "grass"]

    class Games:
        def games(self) -> list[str]:
            return [str(tmp_path / "a"), str(tmp_path / "b")]

    assert list_tasks(Games(), "seen", None) == [
        {"game_file": str(tmp_path / "a")},
        {"game_file": str(tmp_path / "b")},
    ]
    with pytest.raises(ValueError, match="benchmarks.x: object cannot list its tasks"):
        list_tasks(object(), "x", None)
    with pytest.raises(ValueError, match="benchmarks.x: the environment has no tasks"):
        list_tasks(QuizEnv([]), "x", None)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"k": 0}, "k"),
        ({"every_n_steps": 0}, "every_n_steps"),
        ({"concurrency": 0}, "concurrency"),
        ({"limit": 0}, "limit"),
        ({"top_p": 0.0}, "top_p"),
    ],
)
def test_bad_arguments_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make(TASKS, **kwargs)


class InvalidActionEngine:
    """Always names an action that is not admissible: every game is lost at the turn cap."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationResult:
        ids = [*build_toy_tokenizer().encode("<action>fly</action>", add_special_tokens=False)]
        return GenerationResult(ids, [-0.1] * len(ids), [0] * len(ids), "stop")


@pytest.mark.slow
@pytest.mark.alfworld
def test_eval_alfworld_builds_one_env_factory_per_split_and_plays_real_games(tmp_path) -> None:
    pytest.importorskip("alfworld.info", reason="needs the alfworld extra")
    from envs.alfworld import AlfworldEnv
    from envs.alfworld.make_games import make_games
    from frlab.config.compose import compose
    from frlab.train import build_evaluation

    seen = sorted(str(p) for p in make_games(tmp_path / "seen", num_games=3, seed=1))
    make_games(tmp_path / "unseen", num_games=2, seed=2)
    overrides = [
        "experiment=alfworld_qwen7b",
        "eval=alfworld",
        "eval.k=1",
        f"eval.benchmarks.seen.data_dir={tmp_path / 'seen'}",
        f"eval.benchmarks.unseen.data_dir={tmp_path / 'unseen'}",
        "rollout.max_turns=2",
        "env.step_timeout_s=20",
    ]
    evaluation = build_evaluation(compose(overrides, with_hydra=False))
    assert isinstance(evaluation, EpisodeEvaluation) and evaluation.k == 1
    assert (evaluation.loop_cfg.max_turns, evaluation.loop_cfg.max_len) == (2, 16384)
    assert [t["game_file"] for t in evaluation.tasks("seen")] == seen
    assert len(evaluation.tasks("unseen")) == 2
    env = evaluation.factories["seen"]()
    assert isinstance(env, AlfworldEnv) and env.step_timeout_s == 20.0
    # One game per split keeps this test short.
    evaluation = build_evaluation(compose([*overrides, "eval.limit=1"], with_hydra=False))
    metrics = evaluation.evaluate(InvalidActionEngine(), build_toy_tokenizer())
    assert metrics == {
        "eval/seen/avg@1": 0.0,
        "eval/seen/errors": 0.0,
        "eval/unseen/avg@1": 0.0,
        "eval/unseen/errors": 0.0,
        "eval/mean/avg@1": 0.0,
    }
