"""`python_tool`: a multi-turn maths agent with a sandboxed Python interpreter.

Each assistant turn is one of:
- a committed answer (`<answer>...</answer>` or `\\boxed{...}` outside code): the episode ends
  and only that answer is graded 0/1 (envs.python_tool.grading);
- a tool call (Qwen-style `<tool_call>{"name": "python", "arguments": {"code": ...}}`
  </tool_call>` or a fenced python block): the code runs in `run_python` and its output, wrapped
  in `<tool_response>`, is the observation (observation tokens are masked out of the loss by
  the agent loop);
- neither: the episode ends with reward 0 (nothing was committed).
The turn cap ends the episode with reward 0 when the last allowed turn is not an answer.

Info: every step's `tool_calls` is the number of calls made in that step (the agent loop sums
them into the trajectory's count); the final step adds `tool_log` (one entry per call),
`tool_calls_total`, `answer`, `end` (answer | no_tool_call | turn_cap) and `correct`.
`step` blocks while code runs; the agent loop calls it off the event loop.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from envs.base import (
    SYSTEM_PROMPT_MODES,
    Env,
    StepResult,
    TaskSampler,
    check_system_prompt,
    init_arguments,
)
from envs.python_tool.grading import grade_answer
from envs.python_tool.parsing import ToolCall, committed_answer, parse_tool_call
from envs.python_tool.sandbox import PythonResult, run_python
from frlab.errors import ConfigError

SYSTEM_PROMPT = (
    "You are a helpful assistant that solves maths problems and can run Python code.\n"
    "To run code, write exactly one tool call and stop:\n"
    '<tool_call>{"name": "python", "arguments": {"code": "print(2 + 2)"}}</tool_call>\n'
    "(a ```python fenced block also works). The output comes back in <tool_response>. "
    "Only the standard library is available; there is no network. When you are done, give the "
    "final answer as <answer>...</answer> or \\boxed{...}."
)


def load_tasks(data_path: str | Path) -> list[dict[str, Any]]:
    """Tasks from a JSONL file, one {"question": ..., "answer": ...} object per line."""
    tasks = []
    with open(data_path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                tasks.append(json.loads(line))
    return tasks


def gather_tasks(
    tasks: Sequence[Mapping[str, Any]] | None, data_path: str | Path | None
) -> list[Mapping[str, Any]]:
    """The env node's tasks: the `tasks` list, then those of the `data_path` file."""
    return list(tasks or []) + (load_tasks(data_path) if data_path else [])


class PythonToolTasks(TaskSampler):
    """Tasks drawn uniformly at random, with replacement, from the env node's task list."""

    def __init__(self, tasks: Sequence[Mapping[str, Any]]) -> None:
        if not tasks:
            raise ValueError("python_tool env has no tasks: set env.tasks or env.data_path")
        self.tasks = list(tasks)

    def sample(self, rng: random.Random) -> dict[str, Any]:
        return dict(rng.choice(self.tasks))


def _task_field(task: Mapping[str, Any], key: str) -> str:
    value = task.get(key)
    if isinstance(value, bool) or not isinstance(value, str | int | float) or str(value) == "":
        raise ValueError(
            f"python_tool task field {key!r} must be a non-empty string, got {value!r}"
        )
    return str(value)


def format_observation(result: PythonResult, timeout_s: float) -> str:
    """The tool's output as the observation text the model reads next."""
    parts = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("stderr:\n" + result.stderr.rstrip("\n"))
    if result.timed_out:
        parts.append(f"Timed out after {timeout_s:g} s; the process was killed.")
    elif result.exit_code != 0:
        parts.append(f"Exit code {result.exit_code}.")
    if result.truncated:
        parts.append("[output truncated]")
    body = "\n".join(parts) if parts else "(no output)"
    return f"<tool_response>\n{body}\n</tool_response>"


class PythonToolEnv(Env):
    """Maths with a Python tool: call tools for up to `max_turns` turns, then commit an answer."""

    @classmethod
    def missing_sources(cls, config: Mapping[str, Any]) -> dict[str, str]:
        """`env.data_path`, when set, must be an existing file."""
        path = config.get("data_path")
        if path and not Path(str(path)).expanduser().is_file():
            return {"data_path": f"task file not found: {path}"}
        return {}

    @classmethod
    def task_sampler(cls, **kwargs: Any) -> PythonToolTasks:
        """Uniform draws from `env.tasks` and the tasks of `env.data_path`."""
        args = init_arguments(cls, kwargs)
        return PythonToolTasks(gather_tasks(args["tasks"], args["data_path"]))

    def __init__(
        self,
        tasks: Sequence[Mapping[str, Any]] | None = None,
        data_path: str | None = None,
        max_turns: int = 10,
        timeout_s: float = 10.0,
        memory_mb: int = 1024,
        max_output_chars: int = 2048,
        system_prompt: str = SYSTEM_PROMPT,
    ) -> None:
        for name, value in (("max_turns", max_turns), ("memory_mb", memory_mb)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"env.{name}", f"must be a positive integer, got {value!r}")
        if isinstance(max_output_chars, bool) or int(max_output_chars) < 1:
            raise ConfigError("env.max_output_chars", f"must be >= 1, got {max_output_chars!r}")
        if not float(timeout_s) > 0:
            raise ConfigError("env.timeout_s", f"must be > 0, got {timeout_s!r}")
        self.tasks = gather_tasks(tasks, data_path)  # the evaluation lists them
        self.max_turns, self.timeout_s = int(max_turns), float(timeout_s)
        self.memory_mb, self.max_output_chars = int(memory_mb), int(max_output_chars)
        self.system_prompt = check_system_prompt(system_prompt, "env.system_prompt")
        self._answer: str | None = None
        self._turn = 0
        self._log: list[dict[str, Any]] = []

    def reset(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        question = _task_field(task, "question")
        self._answer = _task_field(task, "answer")
        self._turn, self._log = 0, []
        user = {"role": "user", "content": question}
        if self.system_prompt in SYSTEM_PROMPT_MODES:  # default | none: the agent loop's job
            return [user]
        return [{"role": "system", "content": self.system_prompt}, user]

    def step(self, action_text: str) -> StepResult:
        if self._answer is None:
            raise RuntimeError(
                "PythonToolEnv.step called before reset (or after the episode ended)"
            )
        self._turn += 1
        answer = committed_answer(action_text)
        if answer is not None:
            return self._finish(answer, "answer")
        call = parse_tool_call(action_text)
        if call is None:
            return self._finish(None, "no_tool_call")
        if self._turn >= self.max_turns:
            return self._finish(None, "turn_cap")
        observation = self._run_tool(call)
        return StepResult(observation, 0.0, False, {"tool_calls": 1, "turn": self._turn})

    def _run_tool(self, call: ToolCall) -> str:
        if call.code is None:
            self._log.append({"turn": self._turn, "error": call.error})
            return f"<tool_response>\nError: {call.error}\n</tool_response>"
        result = run_python(call.code, self.timeout_s, self.memory_mb, self.max_output_chars)
        self._log.append(
            {
                "turn": self._turn,
                "exit_code": result.exit_code,
                "timed_out": result.timed_out,
                "truncated": result.truncated,
            }
        )
        return format_observation(result, self.timeout_s)

    def _finish(self, answer: str | None, end: str) -> StepResult:
        reward = grade_answer(answer, self._answer or "")
        info = {
            "tool_calls": 0,
            "tool_calls_total": len(self._log),
            "tool_log": list(self._log),
            "answer": answer,
            "end": end,
            "correct": reward > 0,
            "turn": self._turn,
        }
        self._answer = None
        return StepResult(None, reward, True, info)
