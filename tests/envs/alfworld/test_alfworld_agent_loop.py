"""ALFWorld through frlab's agent loop: a win, a loss truncated by `max_turns`, a hung step.

A scripted engine emits fixed turns token by token through the toy tokenizer (it lower-cases,
which ALFWorld commands already are).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from helpers.scripted_engine import ScriptedTextEngine

from envs.alfworld import AlfworldEnv, GameWorker
from frlab.defaults import agent_loop_config, sampling_params
from frlab.model.toy_tokenizer import build_toy_tokenizer
from frlab.rollout.agent_loop import RolloutError, run_episode

TOK = build_toy_tokenizer()
HANG = "test_alfworld_worker:_hang"  # a fake game that never answers a step


def _play(env: AlfworldEnv, game_file: str, turns: list[str], max_turns: int):
    cfg = agent_loop_config(
        max_turns=max_turns, max_len=8192, sampling=sampling_params(max_new_tokens=256)
    )
    episode = run_episode(
        ScriptedTextEngine(TOK, turns), env, {"game_file": game_file}, TOK, cfg, prompt_id=1
    )
    try:
        return asyncio.run(episode)
    finally:
        env.close()


def _act(command: str) -> str:
    return f"<think>ok</think><action>{command}</action>"


@pytest.mark.alfworld
def test_a_won_game_is_a_finished_trajectory_with_reward_one(fixed_game, winning_actions):
    env = AlfworldEnv(step_timeout_s=60)
    traj = _play(env, fixed_game, [_act(a) for a in winning_actions], max_turns=10)
    assert (traj.reward, traj.truncated, traj.failure) == (1.0, False, False)
    assert traj.info["turns"] == len(winning_actions) and traj.info["env"]["won"]
    assert not env.worker.alive()


@pytest.mark.alfworld
def test_the_turn_cap_truncates_a_lost_game(fixed_game, winning_actions):
    env = AlfworldEnv(step_timeout_s=60)
    turns = [_act(winning_actions[0]), "no idea", _act("go to fridge 1"), _act("look")]
    traj = _play(env, fixed_game, turns, max_turns=3)
    assert (traj.reward, traj.truncated, traj.failure) == (0.0, True, True)
    assert traj.info["turns"] == 3 and traj.info["env"]["invalid_actions"] == 1
    observation = TOK.decode(traj.token_ids, skip_special_tokens=True)
    assert "invalid answer: no <action>" in observation and "- go to countertop 1" in observation
    assert env.worker.pid is None


def test_a_hung_step_fails_the_rollout(tmp_path):
    game = tmp_path / "game.tw-pddl"
    game.write_text(json.dumps({}))
    (tmp_path / "traj_data.json").write_text("{}")
    env = AlfworldEnv(worker=GameWorker(HANG), step_timeout_s=0.5, reset_timeout_s=60)
    with pytest.raises(RolloutError, match="env_step.*timed out after 0.5 s"):
        _play(env, str(game), [_act("look")], max_turns=3)
    assert env.worker.pid is None
