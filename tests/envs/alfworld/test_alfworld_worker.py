"""The ALFWorld env's parsing and worker plumbing, with fake workers (no `alfworld` needed).

Fake worker targets live at module level: the worker's child process imports them by name.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest

from envs.alfworld import AlfworldEnv, GameWorker, Turn, WorkerError, WorkerTimeout
from envs.alfworld.env import find_games, parse_action


def _hang(conn, game_file: str, max_steps: int) -> None:
    """Loads fine, then never answers a step."""
    conn.send(("ready", Turn("You are in a room.", ["look", "go to desk 1"], False, False)))
    conn.recv()
    time.sleep(3600)


def _crash(conn, game_file: str, max_steps: int) -> None:
    conn.send(("error", "Traceback: boom"))


def _echo(conn, game_file: str, max_steps: int) -> None:
    """Wins after 'go to desk 1', otherwise echoes the command."""
    conn.send(("ready", Turn("You are in a room.", ["look", "go to desk 1"], False, False)))
    while (command := conn.recv()) is not None:
        won = command == "go to desk 1"
        conn.send(("turn", Turn(f"you did {command}", ["look", "go to desk 1"], won, won)))


HANG, CRASH, ECHO = (f"{__name__}:{name}" for name in ("_hang", "_crash", "_echo"))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def game_file(tmp_path):
    folder = tmp_path / "pick_and_place_simple-Apple-None-Desk-0" / "trial_0"
    folder.mkdir(parents=True)
    (folder / "traj_data.json").write_text(json.dumps({"task_type": "pick_and_place_simple"}))
    (folder / "game.tw-pddl").write_text("{}")
    return str(folder / "game.tw-pddl")


def test_parse_action_takes_exactly_one_action_outside_think():
    assert parse_action(
        "<think>hmm <action>look</action></think><action> Go  To Desk 1. </action>"
    ) == (
        "go to desk 1",
        "",
    )
    assert parse_action("I could <action>look</action>.</think><action>look</action>")[0] == "look"
    assert parse_action("<action>look</action><think>and then <action>look</action>")[0] == "look"
    assert parse_action("<think>unfinished <action>look</action>")[0] is None
    assert parse_action("I will look")[0] is None
    assert "2 <action>" in parse_action("<action>look</action><action>look</action>")[1]
    assert parse_action("<action>  </action>")[0] is None


def test_find_games_skips_movable_and_incomplete(tmp_path, game_file):
    movable = tmp_path / "pick_and_place_with_movable_recep-x" / "trial_0"
    movable.mkdir(parents=True)
    (movable / "traj_data.json").write_text("{}")
    (movable / "game.tw-pddl").write_text("{}")
    lonely = tmp_path / "no_traj" / "trial_0"
    lonely.mkdir(parents=True)
    (lonely / "game.tw-pddl").write_text("{}")
    assert [str(p) for p in find_games(tmp_path)] == [game_file]
    with pytest.raises(FileNotFoundError, match="no ALFWorld games"):
        find_games(lonely.parent.parent / "no_traj" / "trial_0")


def test_task_sampler_reads_alfworld_data(monkeypatch, tmp_path, game_file):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    assert AlfworldEnv.task_sampler().sample(random.Random(0)) == {"game_file": game_file}
    assert AlfworldEnv().games() == [Path(game_file)]
    monkeypatch.delenv("ALFWORLD_DATA")
    with pytest.raises(ValueError, match="ALFWORLD_DATA"):
        AlfworldEnv.task_sampler().sample(random.Random(0))


def test_bad_config_and_task_name_the_field(game_file):
    with pytest.raises(ValueError, match="step_timeout_s"):
        AlfworldEnv(step_timeout_s=0)
    with pytest.raises(ValueError, match="task.game_file"):
        AlfworldEnv().reset({"game_file": "/nonexistent/game.tw-pddl"})


def test_invalid_actions_do_not_advance_and_a_win_pays_one(game_file):
    env = AlfworldEnv(worker=GameWorker(ECHO), step_timeout_s=20, reset_timeout_s=60)
    try:
        messages = env.reset({"game_file": game_file})
        assert "Admissible actions:\n- look\n- go to desk 1" in messages[0]["content"]
        step = env.step("<think>no tag</think> look")
        assert (step.reward, step.done, step.info["valid_action"]) == (0.0, False, False)
        assert "no <action>" in step.observation and "- go to desk 1" in step.observation
        step = env.step("<action>fly away</action>")
        assert "'fly away' is not an admissible action" in step.observation
        step = env.step("<action>look</action>")
        assert step.observation.startswith("you did look") and not step.done
        step = env.step("<think>desk</think><action>go to desk 1</action>")
        assert (step.reward, step.done, step.observation) == (1.0, True, None)
        assert step.info["invalid_actions"] == 2 and step.info["won"]
        assert not env.worker.alive()
    finally:
        env.close()


def test_hung_step_kills_the_worker_and_raises(game_file):
    env = AlfworldEnv(worker=GameWorker(HANG), step_timeout_s=0.5, reset_timeout_s=60)
    try:
        env.reset({"game_file": game_file})
        pid = env.worker.pid
        with pytest.raises(WorkerTimeout, match="timed out after 0.5 s; worker killed"):
            env.step("<action>look</action>")
        assert _gone(pid) and not env.worker.alive()
    finally:
        env.close()


def test_worker_error_is_reported_and_close_leaves_no_process(game_file):
    worker = GameWorker(CRASH)
    with pytest.raises(WorkerError, match="boom"):
        worker.start(game_file, 10, timeout_s=60)
    assert not worker.alive()
    env = AlfworldEnv(worker=GameWorker(ECHO), reset_timeout_s=60)
    env.reset({"game_file": game_file})
    pid = env.worker.pid
    assert not _gone(pid)
    env.close()
    env.close()  # idempotent
    assert _gone(pid) and env.worker.pid is None
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("<action>look</action>")
