"""bench/time_to_reward.py's setup: the arms' objectives are the presets with their default
hyperparameters, and the slow toy env grades exactly as `ParityEnv` with a seeded, recorded,
log-normal latency per episode."""

from __future__ import annotations

import math
import random
import statistics

from helpers.bench import load_bench

from envs.toy import ParityEnv
from frlab.objective import PRESETS, Objective

ttr = load_bench("time_to_reward")


def test_arm_objectives_are_the_presets() -> None:
    for name, arm in ttr.ARMS.items():
        cfg = ttr.objective(arm.objective)
        assert {k: cfg[k] for k in PRESETS[arm.objective]} == PRESETS[arm.objective]
        built = Objective.from_config(cfg)
        assert built.is_group_baseline == arm.group, name
    assert ttr.objective("flashreinforce")["sequence_bernoulli_kl"] == {"delta": 3e-3}
    assert ttr.objective("grpo")["ppo_clip"] == {"eps_low": 0.2, "eps_high": 0.2}


def test_latencies_are_seeded_log_normal_and_recorded() -> None:
    a, b = ttr.Latencies(0.5, 1.0, seed=3), ttr.Latencies(0.5, 1.0, seed=3)
    draws = [a.draw() for _ in range(4001)]
    assert draws == [b.draw() for _ in range(4001)] == a.drawn
    logs = [math.log(x) for x in draws]
    # log-normal: log-draws have mean log(median) and std sigma (4,001 draws: +-0.05)
    assert abs(statistics.fmean(logs) - math.log(0.5)) < 0.05
    assert abs(statistics.stdev(logs) - 1.0) < 0.05
    capped = ttr.Latencies(1.0, 3.0, seed=0, cap_s=2.0)
    assert max(capped.draw() for _ in range(200)) == 2.0


def test_slow_parity_env_grades_as_parity_env() -> None:
    latencies = ttr.Latencies(1e-4, 0.1, seed=0)
    rng = random.Random(0)
    for _ in range(30):
        env, plain = ttr.SlowParityEnv(latencies, 3), ParityEnv(3)
        task = ParityEnv.task_sampler(num_digits=3).sample(rng)
        assert env.reset(task) == plain.reset(task)
        reply = rng.choice(["4", "7", "x", "12"])
        slow, fast = env.step(reply), plain.step(reply)
        assert (slow.reward, slow.done) == (fast.reward, fast.done)
        assert slow.info == {**fast.info, "latency_s": env.latency_s}
    assert len(latencies.drawn) == 30


def test_the_engine_is_the_arms_or_the_command_lines() -> None:
    args = ttr.parse([])
    assert args.engine == "process" and args.arms == list(ttr.DEFAULT_ARMS)
    assert "async_thread" not in args.arms and ttr.ARMS["async_thread"].engine == "thread"
    assert all(ttr.ARMS[a].engine is None for a in ttr.DEFAULT_ARMS)  # they follow --engine
    assert ttr.parse(["--engine", "thread", "--arms", "async,async_thread"]).engine == "thread"
