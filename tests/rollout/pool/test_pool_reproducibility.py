"""Sync mode is bit-reproducible: two pools with the same seed (torch engine, multi-turn toy env
whose steps take random, unseeded time) hand out identical trajectories in the same order,
before and after a weight update; a different seed gives different ones."""

from __future__ import annotations

import random
import time

import pytest
import torch
from helpers.models import policy_of
from helpers.tiny import tiny_qwen2_config

from envs.toy.multi import KeyParityEnv
from frlab.config.schema import RolloutConfig
from frlab.defaults import agent_loop_config, sampling_params, torch_engine
from frlab.model.toy_tokenizer import build_toy_tokenizer
from frlab.rollout.pool import RolloutPool

TOKENIZER = build_toy_tokenizer()
JITTER = random.SystemRandom()  # timing noise that no seed controls


class JitteryKeyParityEnv(KeyParityEnv):
    """KeyParityEnv (two turns) whose reset and step sleep 0-5 ms at random."""

    def reset(self, task):
        time.sleep(JITTER.uniform(0, 0.005))
        return super().reset(task)

    def step(self, action_text: str):
        time.sleep(JITTER.uniform(0, 0.005))
        return super().step(action_text)


def policy():
    config = tiny_qwen2_config(max_position_embeddings=256)
    return policy_of(config=config, seed=0)


def collect(seed: int, max_in_flight: int) -> list[tuple]:
    """Two sync batches of 6 (3 prompts x 2 samples), a weight update in between."""
    model = policy()
    engine = torch_engine(model, max_batch_size=4, seed=seed + 100)  # shared stream unused
    cfg = agent_loop_config(max_turns=2, max_len=48, sampling=sampling_params(max_new_tokens=5))
    pool = RolloutPool(
        engine,
        JitteryKeyParityEnv,
        TOKENIZER,
        cfg,
        task_sampler=KeyParityEnv.task_sampler(),
        batch_size=6,
        max_in_flight=max_in_flight,
        max_policy_lag=1,
        mode="sync",
        samples_per_prompt=2,
        seed=seed,
        num_env_workers=4,
        off_policy_correction=True,
        max_prompt_retries=RolloutConfig.max_prompt_retries,
    )
    out = []
    pool.start()
    try:
        for step in range(2):
            for traj in pool.next_batch(timeout=120):
                out.append(
                    (
                        traj.prompt_id,
                        tuple(traj.token_ids),
                        tuple(traj.behavior_log_probs),
                        tuple(traj.token_versions),
                        traj.reward,
                    )
                )
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(1.01)
            pool.update_weights(model.state_dict(), step + 1)
    finally:
        pool.stop()
    return out


@pytest.mark.slow
def test_two_sync_pools_with_the_same_seed_hand_out_identical_trajectories() -> None:
    first = collect(seed=7, max_in_flight=4)  # fewer slots than rollouts: admission mid-batch
    second = collect(seed=7, max_in_flight=4)
    assert len(first) == 12
    assert [row[0] for row in first] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert first == second  # token ids, behaviour log-probs (bitwise), versions, rewards
    assert {row[3][-1] for row in first} == {0, 1}  # the second batch sampled at version 1
    other = collect(seed=8, max_in_flight=4)
    assert [row[1] for row in other] != [row[1] for row in first]


def test_each_rollout_samples_with_the_seed_of_its_prompt_sample_and_version() -> None:
    """Every engine request of a pool carries turn_seed(rollout_seed(...), turn)."""
    from helpers.pool_fakes import Board, make_pool

    from frlab.rollout.seeding import rollout_seed, turn_seed

    pool, engine = make_pool(
        Board(open_by_default=True),
        mode="sync",
        batch_size=4,
        samples_per_prompt=2,
        max_in_flight=4,
        seed=5,
    )
    seen: list[int | None] = []
    generate = engine.generate

    async def spy(prompt, params):
        seen.append(params.seed)
        return await generate(prompt, params)

    engine.generate = spy
    pool.start()
    try:
        batch = pool.next_batch(timeout=30)
    finally:
        pool.stop()
    assert [t.prompt_id for t in batch] == [0, 0, 1, 1]
    expected = {turn_seed(rollout_seed(5, p, g, 0), 0) for p in (0, 1) for g in (0, 1)}
    assert set(seen) == expected and len(seen) == 4
