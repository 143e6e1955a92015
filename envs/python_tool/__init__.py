"""Multi-turn Python-tool environment: a sandboxed interpreter and the agent env.

`run_python` (envs.python_tool.sandbox) runs untrusted code; its docstring lists what the
sandbox covers and what it does not. `PythonToolEnv` (envs.python_tool.env) drives episodes.
"""

from envs.python_tool.env import PythonToolEnv, PythonToolTasks, format_observation
from envs.python_tool.parsing import ToolCall, committed_answer, parse_tool_call
from envs.python_tool.sandbox import PythonResult, run_python, sandbox_mode

__all__ = [
    "PythonResult",
    "PythonToolEnv",
    "PythonToolTasks",
    "ToolCall",
    "committed_answer",
    "format_observation",
    "parse_tool_call",
    "run_python",
    "sandbox_mode",
]
