"""Per-rollout seeds: the same parts give the same seed in any process, different parts
different seeds, all in [0, 2**63); the agent loop gives each turn its own derived seed; the
pool seeds each rollout from (seed, prompt id, sample index, start version)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
from test_agent_loop import TOK, ScriptedEngine, ScriptedEnv, ids

from frlab.defaults import agent_loop_config, sampling_params
from frlab.rollout.agent_loop import run_episode
from frlab.rollout.engine import SamplingParams
from frlab.rollout.seeding import derive_seed, rollout_seed, turn_seed


def test_seeds_are_the_same_in_another_process_with_another_hash_salt() -> None:
    code = "from frlab.rollout.seeding import rollout_seed; print(rollout_seed(3, 17, 1, 5))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == rollout_seed(3, 17, 1, 5)


def test_seeds_differ_by_every_part_and_fit_63_bits() -> None:
    grid = [
        rollout_seed(s, p, g, v)
        for s in range(3)
        for p in range(20)
        for g in range(3)
        for v in range(4)
    ]
    assert len(set(grid)) == len(grid)
    assert all(0 <= x < 2**63 for x in grid)
    assert derive_seed(1, 2) != derive_seed(2, 1) and derive_seed(-1) != derive_seed(1)


def test_each_turn_of_a_seeded_episode_gets_its_own_derived_seed() -> None:
    engine = ScriptedEngine([ids("a"), ids("b"), ids("c")])
    cfg = agent_loop_config(max_turns=3, max_len=64, sampling=sampling_params(max_new_tokens=2))
    asyncio.run(
        run_episode(engine, ScriptedEnv(done_after=3), {"q": "hi"}, TOK, cfg, prompt_id=4, seed=99)
    )
    assert [p.seed for _, p in engine.calls] == [turn_seed(99, t) for t in range(3)]
    unseeded = ScriptedEngine([ids("a")])
    asyncio.run(run_episode(unseeded, ScriptedEnv(), {"q": "hi"}, TOK, cfg, prompt_id=4))
    assert unseeded.calls[0][1].seed is None


def test_seed_is_not_a_config_key_of_rollout_sampling() -> None:
    with pytest.raises(ValueError, match="rollout.sampling.seed.*not a sampling key"):
        SamplingParams.from_mapping({"seed": 3})
