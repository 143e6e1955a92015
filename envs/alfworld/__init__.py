"""ALFWorld text games for frlab agents (extra `alfworld`).

`AlfworldEnv` plays ALFRED-format game folders found under `ALFWORLD_DATA`, one worker process
per episode; `envs.alfworld.make_games` writes small offline games (the official download needs
the internet). Importing this package does not import `alfworld`: only the worker does.
"""

from envs.alfworld.env import AlfworldEnv, AlfworldTasks, find_games, parse_action
from envs.alfworld.worker import GameWorker, Turn, WorkerError, WorkerTimeout

__all__ = [
    "AlfworldEnv",
    "AlfworldTasks",
    "GameWorker",
    "Turn",
    "WorkerError",
    "WorkerTimeout",
    "find_games",
    "parse_action",
]
