"""Generated ALFRED games played through `AlfworldEnv` with the real `alfworld` package.

A fixed one-room game is won by a known action sequence and lost by wrong actions up to a
turn cap; sampled games are won by a scripted search over the admissible actions.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

pytest.importorskip(
    "alfworld.info", reason="needs the alfworld extra (pip install frlab[alfworld])"
)

from envs.alfworld import AlfworldEnv  # noqa: E402
from envs.alfworld.make_games import main, make_games  # noqa: E402

pytestmark = pytest.mark.alfworld


def _act(command: str) -> str:
    return f"<think>next: {command}</think><action>{command}</action>"


def test_generator_writes_alfred_format(tmp_path):
    main([str(tmp_path), "--num-games", "3", "--seed", "7"])
    games = sorted(tmp_path.rglob("game.tw-pddl"))
    assert len(games) == 3
    game = json.loads(games[0].read_text())
    traj = json.loads((games[0].parent / "traj_data.json").read_text())
    assert game["solvable"] is True and "(:domain alfred)" in game["pddl_problem"]
    assert game["pddl_domain"].lstrip().startswith(";;") and "UNKNOWN GOAL" not in game["grammar"]
    assert traj["task_type"] == "pick_and_place_simple"
    assert f"{traj['pddl_params']['object_target']}_bar_" in game["pddl_problem"]
    again = sorted(make_games(tmp_path / "again", 3, 7))  # same seed, same games
    assert [p.read_text() for p in games] == [p.read_text() for p in again]


def test_scripted_episode_wins(fixed_game, winning_actions):
    env = AlfworldEnv(step_timeout_s=60)
    try:
        content = env.reset({"game_file": fixed_game})[0]["content"]
        assert "Your task is to:" in content and "apple" in content
        assert "Admissible actions:" in content and "- go to countertop 1" in content
        for command in winning_actions[:-1]:
            step = env.step(_act(command))
            assert (step.reward, step.done) == (0.0, False), step.observation
            assert "Admissible actions:" in step.observation
        assert "- move apple 1 to diningtable 1" in step.observation
        step = env.step(_act(winning_actions[-1]))
        assert (step.reward, step.done, step.info["won"]) == (1.0, True, True)
        assert env.failure(step.reward) is False
    finally:
        env.close()


def test_wrong_actions_until_the_turn_cap_lose(fixed_game):
    env = AlfworldEnv(step_timeout_s=60)
    max_turns, reward, done = 6, 0.0, False
    try:
        env.reset({"game_file": fixed_game})
        wrong = ["go to fridge 1", "open fridge 1", "close fridge 1", "look", "inventory"]
        for turn in range(max_turns):
            text = _act(wrong[turn % len(wrong)]) if turn != 2 else "no action at all"
            step = env.step(text)
            reward, done = reward + step.reward, step.done
            assert not done
        assert reward == 0.0 and env.failure(reward)
        pid = env.worker.pid
        assert pid is not None and env.worker.alive()
    finally:
        env.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def _policy(admissible: list[str], obj: str, recep: str, holding: bool, seen: set[str]) -> str:
    """Search for `obj` (visit, open), take it, go to `recep`, open it if needed, move it there."""

    def first(prefix: str, contains: str = "") -> str | None:
        return next((a for a in admissible if a.startswith(prefix) and contains in a), None)

    if holding:
        action = first(f"move {obj} ", f" {recep} ") or first("open ") or first(f"go to {recep} ")
    else:
        action = first(f"take {obj} ") or first("open ")
        action = action or next(a for a in admissible if a.startswith("go to ") and a not in seen)
    assert action is not None, admissible
    return action


@pytest.mark.slow
def test_sampled_games_are_winnable(tmp_path):
    make_games(tmp_path, num_games=2, seed=3)
    env_for_tasks = AlfworldEnv(data_dir=str(tmp_path))
    rng = random.Random(0)
    for game_file in env_for_tasks.games():
        params = json.loads((Path(game_file).parent / "traj_data.json").read_text())["pddl_params"]
        obj, recep = params["object_target"].lower(), params["parent_target"].lower()
        env = AlfworldEnv(step_timeout_s=60)
        try:
            observation = env.reset({"game_file": str(game_file)})[0]["content"]
            holding, seen, step = False, set(), None
            for _ in range(20):
                admissible = observation.split("Admissible actions:\n")[1].split("\n")
                action = _policy([a[2:] for a in admissible], obj, recep, holding, seen)
                seen.add(action)
                holding = holding or action.startswith("take ")
                step = env.step(_act(action))
                if step.done:
                    break
                observation = step.observation
            assert step is not None and step.reward == 1.0, game_file
        finally:
            env.close()
    tasks = AlfworldEnv.task_sampler(data_dir=str(tmp_path))
    assert tasks.sample(rng)["game_file"] in map(str, env_for_tasks.games())
