"""MathEnv: one graded turn, prompt templates, tasks from a dataset object or a source."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from envs.base import Env
from envs.math import TEMPLATES, MathEnv
from envs.math.env import unescape_newlines

TASKS = [
    {"question": "What is 2 + 3?", "answer": "5"},
    {"question": "What is 10 / 4?", "answer": "2.5"},
    {"question": "Janet has 9 eggs.", "answer": "9 eggs\n#### 9"},
]
CONFIG = Path(__file__).resolve().parents[3] / "configs" / "env" / "math.yaml"


def test_a_correct_reply_earns_one_and_a_wrong_one_fails() -> None:
    env = MathEnv(dataset=TASKS)
    assert isinstance(env, Env)
    messages = env.reset(TASKS[0])
    assert messages == [
        {"role": "user", "content": TEMPLATES["instruct"].format(question="What is 2 + 3?")}
    ]
    assert "\\boxed{}" in messages[0]["content"]
    step = env.step("2 + 3 = 5, so \\boxed{5}.")
    assert (step.reward, step.done, step.observation) == (1.0, True, None)
    assert step.info == {"answer": "5", "extracted": "5"} and not env.failure(step.reward)
    env.reset(TASKS[2])
    wrong = env.step("The answer is 8.")
    assert wrong.reward == 0.0 and wrong.info["extracted"] == "8" and env.failure(wrong.reward)


def test_step_needs_a_fresh_reset() -> None:
    env = MathEnv(dataset=TASKS)
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("\\boxed{5}")
    env.reset(TASKS[0])
    env.step("\\boxed{5}")
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("\\boxed{5}")


def test_templates() -> None:
    base = MathEnv(dataset=TASKS, template="base").reset(TASKS[1])[0]["content"]
    assert base.startswith("Question: What is 10 / 4?\n") and "Answer:" in base
    custom = MathEnv(dataset=TASKS, template="Q: {question}\nA:").reset(TASKS[1])[0]["content"]
    assert custom == "Q: What is 10 / 4?\nA:"
    with pytest.raises(ValueError, match="env.template"):
        MathEnv(dataset=TASKS, template="chatty")


def test_task_sampler_visits_every_task_once_per_epoch() -> None:
    tasks, rng = MathEnv.task_sampler(dataset=TASKS), random.Random(0)
    first = [tasks.sample(rng)["question"] for _ in range(3)]
    second = [tasks.sample(rng)["question"] for _ in range(3)]
    questions = sorted(t["question"] for t in TASKS)
    assert sorted(first) == questions and sorted(second) == questions


@pytest.mark.parametrize(
    ("task", "field"),
    [({"answer": "1"}, "question"), ({"question": "q", "answer": None}, "answer")],
)
def test_bad_task_names_the_field(task: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"'{field}'"):
        MathEnv(dataset=TASKS).reset(task)


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        MathEnv()
    with pytest.raises(ValueError, match="exactly one"):
        MathEnv(source="a.jsonl", dataset=TASKS)
    with pytest.raises(FileNotFoundError, match="env.source"):
        MathEnv(source=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="timeout_s"):
        MathEnv(dataset=TASKS, timeout_s=0)


def test_source_tasks_load_lazily_once_and_are_shared(tmp_path: Path) -> None:
    path = tmp_path / "math.jsonl"
    path.write_text(
        "".join(json.dumps({"q": t["question"], "a": t["answer"]}) + "\n" for t in TASKS)
    )
    kwargs = {"source": str(path), "question_key": "q", "answer_key": "a"}
    first, second = MathEnv(**kwargs), MathEnv(**kwargs)
    tasks = MathEnv.task_sampler(**kwargs)
    task = tasks.sample(random.Random(1))
    assert first.dataset is second.dataset is tasks.dataset and len(first.dataset) == 3
    assert set(task) == {"question", "answer", "source", "index"}
    second.reset(task)
    expected = {"What is 2 + 3?": "5", "What is 10 / 4?": "2.5", "Janet has 9 eggs.": "9"}
    assert second.step(f"\\boxed{{{expected[task['question']]}}}").reward == 1.0


def test_config_file_builds_the_env_through_frlab(tmp_path: Path) -> None:
    from frlab.rollout.pool.factory import env_factory, task_sampler_factory

    path = tmp_path / "tiny.jsonl"
    path.write_text(json.dumps({"question": "1 + 1?", "answer": "2"}) + "\n")
    node = OmegaConf.load(CONFIG)
    assert node._target_ == "envs.math.MathEnv"
    node.source, node.template = str(path), "base"
    make = env_factory(node)
    env = make()
    task = task_sampler_factory(node)().sample(random.Random(0))
    assert env.reset(task)[0]["content"].startswith("Question: 1 + 1?")
    assert env.step("so \\boxed{2}").reward == 1.0


@pytest.mark.slow
def test_default_config_source_generates_training_problems() -> None:
    pytest.importorskip("reasoning_gym")
    node = OmegaConf.to_container(OmegaConf.load(CONFIG))
    node.pop("_target_")
    assert node["source"] == "reasoning-gym:gsm_symbolic"
    env = MathEnv(**{**node, "limit": 3})
    task = MathEnv.task_sampler(**{**node, "limit": 3}).sample(random.Random(0))
    assert len(env.dataset) == 3 and task["answer"].lstrip("-").isdigit()
    env.reset(task)
    assert env.step(f"\\boxed{{{task['answer']}}}").reward == 1.0


def test_a_typed_backslash_n_in_a_template_is_a_newline() -> None:
    template = "{question}\\nGive only the final answer as a number."  # as typed on a shell
    content = MathEnv(dataset=TASKS, template=template).reset(TASKS[0])[0]["content"]
    assert content == "What is 2 + 3?\nGive only the final answer as a number."
    latex = MathEnv(dataset=TASKS, template="{question}\\nIs x \\neq \\nabla y?")
    assert latex.reset(TASKS[0])[0]["content"] == "What is 2 + 3?\nIs x \\neq \\nabla y?"
    assert unescape_newlines("a\\\\nb") == "a\\\\nb"  # an escaped backslash stays as written


def test_answer_format_is_used_for_the_reward() -> None:
    truncated = "Step 1: 2 + 3 = 5\nStep 2: add 5"
    lenient = MathEnv(dataset=TASKS)
    lenient.reset(TASKS[0])
    assert lenient.step(truncated).reward == 1.0  # the last number happens to match
    strict = MathEnv(dataset=TASKS, answer_format="final_line")
    strict.reset(TASKS[0])
    step = strict.step(truncated)
    assert step.reward == 0.0 and step.info["extracted"] is None
    with pytest.raises(ValueError, match="env.answer_format`: must be one of any, boxed"):
        MathEnv(dataset=TASKS, answer_format="strict")


def test_a_preset_split_that_the_source_lacks_fails_when_the_env_is_built() -> None:
    with pytest.raises(ValueError, match="env.split='test'.*reasoning-gym generator"):
        MathEnv(source="reasoning-gym:basic_arithmetic", split="test")
    with pytest.raises(ValueError, match="env.holdout.part"):
        MathEnv(source="reasoning-gym:basic_arithmetic", holdout={"fraction": 0.5, "part": "x"})
