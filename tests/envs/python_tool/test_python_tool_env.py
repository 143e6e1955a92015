"""PythonToolEnv episodes with scripted actions: tool calls run and come back as observations,
only a committed answer is graded, no call or the turn cap ends the episode, calls are logged."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from envs.base import Env
from envs.python_tool import PythonResult, PythonToolEnv, format_observation
from frlab.config.compose import instantiate
from frlab.rollout.pool.factory import task_sampler_factory

TASK = {"question": "What is 6 times 7?", "answer": "42"}
CONFIG = Path(__file__).resolve().parents[3] / "configs" / "env" / "python_tool.yaml"


def call(code: str) -> str:
    return (
        "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"
    )


def started(**kwargs) -> PythonToolEnv:
    env = PythonToolEnv(tasks=[TASK], **{"timeout_s": 5.0, **kwargs})
    env.reset(TASK)
    return env


def test_reset_gives_system_and_question() -> None:
    messages = PythonToolEnv().reset(TASK)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"] == TASK["question"]
    assert "<tool_call>" in messages[0]["content"] and "<answer>" in messages[0]["content"]


def test_tool_then_correct_answer() -> None:
    env = started()
    first = env.step("I'll compute it.\n" + call("print(6 * 7)"))
    assert not first.done and first.reward == 0.0 and first.info["tool_calls"] == 1
    assert first.observation == "<tool_response>\n42\n</tool_response>"
    last = env.step("The tool says 42, so <answer>42</answer>")
    assert last.done and last.reward == 1.0 and last.observation is None
    assert last.info["tool_calls"] == 0  # the agent loop sums per-step counts
    assert last.info["tool_calls_total"] == 1 and last.info["end"] == "answer"
    assert last.info["tool_log"] == [
        {"turn": 1, "exit_code": 0, "timed_out": False, "truncated": False}
    ]


def test_wrong_boxed_answer_scores_zero() -> None:
    step = started().step("Clearly \\boxed{41}.")
    assert step.done and step.reward == 0.0 and step.info["answer"] == "41"


def test_no_call_and_no_answer_ends_with_zero() -> None:
    step = started().step("The answer is 42.")  # right number, but nothing committed
    assert step.done and step.reward == 0.0
    assert step.info["end"] == "no_tool_call" and step.info["answer"] is None


def test_fenced_block_runs_and_errors_come_back_as_text() -> None:
    env = started()
    step = env.step("```python\nprint('partial')\n1 / 0\n```")
    assert not step.done and step.info["tool_calls"] == 1
    assert "partial" in step.observation and "ZeroDivisionError" in step.observation
    assert "Exit code 1." in step.observation


def test_turn_cap_ends_without_running_the_last_call() -> None:
    env = started(max_turns=2)
    assert not env.step(call("print(1)")).done
    step = env.step(call("print(2)"))
    assert step.done and step.reward == 0.0 and step.info["end"] == "turn_cap"
    assert step.info["tool_calls_total"] == 1


def test_answer_in_the_same_turn_as_a_call_ends_the_episode() -> None:
    step = started().step(call("print(42)") + " <answer>42</answer>")
    assert step.done and step.reward == 1.0 and step.info["tool_calls_total"] == 0


def test_malformed_call_is_an_observation_and_is_logged() -> None:
    env = started()
    step = env.step('<tool_call>{"name": "shell", "arguments": {"code": "ls"}}</tool_call>')
    assert not step.done and "unknown tool 'shell'" in step.observation
    last = env.step("<answer>42</answer>")
    assert last.info["tool_calls_total"] == 1 and "error" in last.info["tool_log"][0]


def test_step_outside_an_episode_raises() -> None:
    env = PythonToolEnv()
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("<answer>1</answer>")
    env.reset(TASK)
    env.step("<answer>1</answer>")
    with pytest.raises(RuntimeError):
        env.step("<answer>1</answer>")


def test_observation_format() -> None:
    timed = PythonResult("x" * 3, "", -9, True, True)
    text = format_observation(timed, 10.0)
    assert text.startswith("<tool_response>\nxxx\n") and "Timed out after 10 s" in text
    assert "[output truncated]" in text
    assert format_observation(PythonResult("", "", 0, False, False), 1) == (
        "<tool_response>\n(no output)\n</tool_response>"
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"max_turns": 0}, "env.max_turns"), ({"timeout_s": 0}, "env.timeout_s")],
)
def test_bad_settings_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        PythonToolEnv(**kwargs)


def test_bad_task_names_the_field() -> None:
    with pytest.raises(ValueError, match="'answer'"):
        PythonToolEnv().reset({"question": "q"})


def test_tasks_from_jsonl_and_sampling(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"question": "1+1?", "answer": "2"}\n\n{"question": "2+2?", "answer": 4}\n')
    assert [t["question"] for t in PythonToolEnv(data_path=str(path)).tasks] == ["1+1?", "2+2?"]
    tasks = PythonToolEnv.task_sampler(data_path=str(path))
    drawn = {tasks.sample(random.Random(seed))["question"] for seed in range(20)}
    assert drawn == {"1+1?", "2+2?"}
    with pytest.raises(ValueError, match="env.data_path"):
        PythonToolEnv.task_sampler()


def test_config_instantiates_the_env() -> None:
    node = OmegaConf.load(CONFIG)
    assert node["_target_"] == "envs.python_tool.PythonToolEnv"
    env = instantiate(node, key="env", tasks=[TASK])
    assert isinstance(env, PythonToolEnv) and isinstance(env, Env)
    tasks = task_sampler_factory(OmegaConf.merge(node, {"tasks": [TASK]}))()
    assert tasks.sample(random.Random(0)) == TASK
