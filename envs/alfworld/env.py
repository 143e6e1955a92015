"""`AlfworldEnv`: ALFWorld household text games behind the frlab `Env` interface.

A task is one game folder (ALFRED format: `traj_data.json` + `game.tw-pddl`) found under
`data_dir` (default: the `ALFWORLD_DATA` environment variable). `num_games` keeps a fixed
subset: the first N games after shuffling the sorted list with `random.Random(games_seed)`
(the FlashREINFORCE reference trains on 1,024 ALFWorld training games; it does not publish
which, so frlab draws them reproducibly from the whole training split). Each episode runs its game
in
its own worker process (envs.alfworld.worker: TextWorld's parser is not safe to share) with a
timeout on every step; a hung step kills the worker and raises, failing that rollout.

Turn protocol: the model reasons in `<think>...</think>` and then names exactly one admissible
action in `<action>...</action>`. Every observation lists the admissible actions. An answer
with no action, several actions or an action that is not admissible does not advance the game:
the observation says what was wrong and repeats the choices. Reward is 1 on a win, else 0 (the
paper's sparse task reward); the turn cap is the agent loop's `max_turns`, so the environment
only ends an episode when the game itself is over.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from envs.alfworld.worker import GameWorker, Turn
from envs.base import Env, StepResult, TaskSampler, init_arguments
from frlab.errors import ConfigError

GAME_FILE = "game.tw-pddl"
TRAJ_FILE = "traj_data.json"

INSTRUCTIONS = (
    "You are an agent in a household text game. Each turn, first reason inside "
    "<think>...</think>, then give exactly one action, copied from the admissible actions, "
    "inside <action>...</action>."
)

_ACTION = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)


def normalise(command: str) -> str:
    """Lower case, single spaces, no trailing period: the form actions are compared in."""
    return " ".join(command.strip().lower().split()).rstrip(".").strip()


def strip_reasoning(text: str) -> str:
    """The answer part of a turn: after the last `</think>` (the opening tag may sit in the
    chat template), or before an unfinished `<think>`."""
    lowered = text.lower()
    if (end := lowered.rfind("</think>")) >= 0:
        return text[end + len("</think>") :]
    start = lowered.find("<think>")
    return text if start < 0 else text[:start]


def parse_action(text: str) -> tuple[str | None, str]:
    """The one action named in `<action>` after the reasoning; (None, reason) when there is not
    exactly one non-empty action tag."""
    found = _ACTION.findall(strip_reasoning(text))
    if not found:
        return None, "no <action>...</action> found"
    if len(found) > 1:
        return None, f"{len(found)} <action> tags found; give exactly one"
    action = normalise(found[0])
    if not action:
        return None, "the <action> tag is empty"
    return action, ""


def format_admissible(admissible: list[str]) -> str:
    return "Admissible actions:\n" + "\n".join(f"- {a}" for a in admissible)


def find_games(data_dir: str | os.PathLike[str]) -> list[Path]:
    """Every ALFRED game folder's `game.tw-pddl` under `data_dir` (sorted, both files present);
    like ALFWorld, folders whose path names "movable" or "Sliced" objects are skipped."""
    root = Path(data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"env.data_dir (or ALFWORLD_DATA) is not a directory: {root}")
    games = [
        path
        for path in sorted(root.rglob(GAME_FILE))
        if (path.parent / TRAJ_FILE).is_file()
        and not any(word in str(path.parent.relative_to(root)) for word in ("movable", "Sliced"))
    ]
    if not games:
        raise FileNotFoundError(f"no ALFWorld games ({GAME_FILE} + {TRAJ_FILE}) under {root}")
    return games


def check_num_games(num_games: int | None) -> int | None:
    """`num_games` as an int >= 1 or None, or a ValueError naming `env.num_games`."""
    if num_games is not None and (isinstance(num_games, bool) or int(num_games) < 1):
        raise ConfigError("env.num_games", f"must be >= 1 or null, got {num_games!r}")
    return None if num_games is None else int(num_games)


def select_games(data_dir: str | None, num_games: int | None, games_seed: int) -> list[Path]:
    """The game files under `data_dir`, or the sorted first `num_games` of them after a shuffle
    with `random.Random(games_seed)` (the same subset on every call)."""
    if not data_dir:
        raise ConfigError("env.data_dir", "is not set and ALFWORLD_DATA is empty")
    games = find_games(data_dir)
    if num_games is not None:
        if num_games > len(games):
            raise ConfigError(
                "env.num_games",
                f"env.num_games={num_games} but {data_dir} holds only {len(games)} games",
            )
        random.Random(games_seed).shuffle(games)
        games = sorted(games[:num_games])
    return games


class AlfworldTasks(TaskSampler):
    """Games drawn uniformly at random, with replacement: `{"game_file": path}` (the game
    folder is listed on the first draw)."""

    def __init__(
        self, data_dir: str | None, num_games: int | None = None, games_seed: int = 0
    ) -> None:
        self.data_dir = data_dir if data_dir is not None else os.environ.get("ALFWORLD_DATA")
        self.num_games, self.games_seed = check_num_games(num_games), int(games_seed)
        self._games: list[Path] | None = None

    def games(self) -> list[Path]:
        """The games tasks are drawn from (listed once)."""
        if self._games is None:
            self._games = select_games(self.data_dir, self.num_games, self.games_seed)
        return self._games

    def sample(self, rng: random.Random) -> dict[str, Any]:
        return {"game_file": str(rng.choice(self.games()))}


class AlfworldEnv(Env):
    """One ALFWorld episode per instance; tasks are `{"game_file": path}`."""

    @classmethod
    def missing_sources(cls, config: Mapping[str, Any]) -> dict[str, str]:
        """The game folder (`env.data_dir`, else ALFWORLD_DATA) must hold at least one game."""
        data_dir = config.get("data_dir") or os.environ.get("ALFWORLD_DATA")
        if not data_dir:
            return {"data_dir": "not set and ALFWORLD_DATA is empty (the game folder)"}
        try:
            find_games(data_dir)
        except FileNotFoundError as exc:
            return {"data_dir": str(exc)}
        return {}

    @classmethod
    def task_sampler(cls, **kwargs: Any) -> AlfworldTasks:
        """Games of `env.data_dir` (or its `num_games` subset) drawn at random."""
        args = init_arguments(cls, kwargs)
        return AlfworldTasks(args["data_dir"], args["num_games"], args["games_seed"])

    def __init__(
        self,
        data_dir: str | None = None,
        step_timeout_s: float = 30.0,
        reset_timeout_s: float = 120.0,
        max_game_steps: int = 1000,
        worker: GameWorker | None = None,
        num_games: int | None = None,
        games_seed: int = 0,
    ) -> None:
        for name, value in (
            ("step_timeout_s", step_timeout_s),
            ("reset_timeout_s", reset_timeout_s),
        ):
            if not float(value) > 0:
                raise ConfigError(f"env.{name}", f"must be > 0, got {value}")
        if int(max_game_steps) < 1:
            raise ConfigError("env.max_game_steps", f"must be >= 1, got {max_game_steps}")
        self.num_games = check_num_games(num_games)
        self.games_seed = int(games_seed)
        self.data_dir = data_dir if data_dir is not None else os.environ.get("ALFWORLD_DATA")
        self.step_timeout_s = float(step_timeout_s)
        self.reset_timeout_s = float(reset_timeout_s)
        self.max_game_steps = int(max_game_steps)
        self._worker = worker if worker is not None else GameWorker()
        self._games: list[Path] | None = None
        self._admissible: list[str] = []
        self._game_file: str | None = None
        self._invalid = 0

    @property
    def worker(self) -> GameWorker:
        return self._worker

    def games(self) -> list[Path]:
        """The game files under `data_dir`, or its `num_games` subset (listed once; the
        evaluation plays them all)."""
        if self._games is None:
            self._games = select_games(self.data_dir, self.num_games, self.games_seed)
        return self._games

    def reset(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        game_file = task.get("game_file")
        if not isinstance(game_file, str) or not Path(game_file).is_file():
            raise ValueError(f"task.game_file must name an existing {GAME_FILE}, got {game_file!r}")
        self._game_file, self._invalid = game_file, 0
        turn = self._worker.start(game_file, self.max_game_steps, self.reset_timeout_s)
        self._admissible = list(turn.admissible)
        content = (
            f"{INSTRUCTIONS}\n\n{turn.observation.strip()}\n\n{format_admissible(turn.admissible)}"
        )
        return [{"role": "user", "content": content}]

    def step(self, action_text: str) -> StepResult:
        if self._game_file is None:
            raise RuntimeError("AlfworldEnv.step called before reset (or after the episode ended)")
        action, problem = parse_action(action_text)
        choices = {normalise(a): a for a in self._admissible}
        if action is not None and action not in choices:
            problem = f"{action!r} is not an admissible action"
        if problem:
            self._invalid += 1
            text = f"Invalid answer: {problem}. Reply with <action>one admissible action</action>."
            observation = f"{text}\n\n{format_admissible(self._admissible)}"
            return StepResult(observation, 0.0, False, self._info(won=False, valid=False))
        turn = self._worker.step(choices[action], self.step_timeout_s)
        return self._outcome(turn)

    def _outcome(self, turn: Turn) -> StepResult:
        self._admissible = list(turn.admissible)
        info = self._info(won=turn.won, valid=True)
        if turn.won or turn.done:
            self._game_file = None
            self._worker.close()
            return StepResult(None, 1.0 if turn.won else 0.0, True, info)
        observation = f"{turn.observation.strip()}\n\n{format_admissible(turn.admissible)}"
        return StepResult(observation, 0.0, False, info)

    def _info(self, won: bool, valid: bool) -> dict[str, Any]:
        return {
            "won": bool(won),
            "valid_action": bool(valid),
            "invalid_actions": self._invalid,
            "game_file": self._game_file,
        }

    def close(self) -> None:
        self._game_file = None
        self._worker.close()
