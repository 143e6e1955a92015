"""Async vs sync rollout pipeline under heavy-tailed environment latency (a benchmark).

FlashREINFORCE's case for one-rollout-per-prompt asynchronous collection (FlashREINFORCE paper, Sec.
3): with
long-tailed episode times, a synchronous "collect B, then train" loop waits for the slowest
rollout of every batch while the learner idles, whereas the async pool keeps `max_in_flight`
rollouts running, hands out the first B that finish and bounds staleness by admission
control. Both modes here run the SAME stack: a random-init tiny Qwen2 policy, the real
FlashREINFORCE Lightning learner (`FlashReinforceModule`), the `torch` engine, the agent loop,
`RolloutDataModule` and `WeightSyncCallback` (sync_every=1), the same B and the same task
stream. The environment is a one-turn "say this digit" task whose step sleeps a log-normal time
drawn with the
task (log-std `--latency-sigma` 1.0: about two >3x-median and one >5x-median outliers per
batch of 16). The median is `--latency-median` seconds, or by default 0.3x the learner's own
update time on this machine (measured first on synthetic batches), so the comparison means the same
thing on
a fast or a loaded machine: episodes comparable to an update, with a heavy tail.

Printed per mode: optimizer updates per minute, the learner's idle fraction (time blocked
waiting for a batch / training wall time, also without the first cold-start batch), policy
lag and pool counters, the mean batch reward of the first and last 5 updates and the mean
trust-region acceptance; then the async/sync update-rate ratio. Targets: ratio >= 2.0 and
async learner idle <= 20%.

This measures throughput only: updates that do not learn are no speed-up. Its task and
settings are not learnt reliably (one correct digit of ~60 tokens per prompt, B=16, a 4-layer
model at lr 1e-3): both modes settle on a few constant replies (sequence KL and gradient norm
fall to ~0; sync near reward 0.2, async near 0.1). In the async mode 64 rollouts in flight
for B=16 keep every trajectory about 4 versions old (Little's law: lag pinned at the bound
of 4), and the Bernoulli-KL gate (delta 3e-3) rejects most of them (acceptance 0.04-0.21
over the first ~125 updates). Wall-clock time to a reward, on a task every arm learns, is
bench/time_to_reward.py.

    python bench/async_pipeline.py --seconds 45
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch

from envs.base import Env, StepResult
from frlab.build import build_learner
from frlab.config.arguments import declared_arguments
from frlab.config.schema import ModelConfig, RolloutConfig
from frlab.data.datamodule import RolloutDataModule
from frlab.defaults import agent_loop_config, sampling_params, torch_engine
from frlab.learner.metrics import ACCEPTANCE
from frlab.model.policy import build_policy
from frlab.model.toy_tokenizer import build_toy_tokenizer
from frlab.objective.presets import PRESETS
from frlab.rollout.callbacks import WeightSyncCallback
from frlab.rollout.pool import RolloutPool


def model_cfg(hidden: int, layers: int) -> dict[str, Any]:
    """A random-init Qwen2 over the 61-token toy vocabulary."""
    return {
        "config": {
            "model_type": "qwen2",
            "vocab_size": 64,
            "hidden_size": hidden,
            "intermediate_size": 2 * hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 64,
        },
        "seed": 0,
    }


OBJECTIVE = {**PRESETS["flashreinforce"], "sequence_bernoulli_kl": {"delta": 3e-3}}
OPTIM = {"lr": 1e-3, "weight_decay": 0.1, "grad_clip": 1.0, "scheduler": "constant"}


class SlowDigitEnv(Env):
    """One turn: "say 7" -> reward 1 if the reply's first digit is 7. The step takes a
    heavy-tailed (log-normal) time fixed by the task, so both modes see the same latencies."""

    def __init__(self, median_s: float = 0.2, sigma: float = 1.0, cap_s: float = 30.0) -> None:
        self.mu, self.sigma, self.cap_s = math.log(median_s), sigma, cap_s
        self._task: Mapping[str, Any] = {}

    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        latency = min(self.cap_s, rng.lognormvariate(self.mu, self.sigma))
        return {"digit": rng.randrange(10), "latency_s": latency}

    def reset(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        self._task = task
        return [{"role": "user", "content": f"say {task['digit']}"}]

    def step(self, action_text: str) -> StepResult:
        time.sleep(float(self._task["latency_s"]))
        digits = [c for c in action_text if c.isdigit()]
        reward = float(bool(digits) and digits[0] == str(self._task["digit"]))
        return StepResult(observation=None, reward=reward, done=True, info={})


class Clock(L.Callback):
    """Training wall time, batch-wait time, rewards, lags and trust-region acceptance; stops
    after `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.t0 = self.t1 = 0.0
        self.waits: list[float] = []
        self.rewards: list[float] = []
        self.lags: list[int] = []
        self.acceptance: list[float] = []

    def on_train_start(self, trainer, pl_module) -> None:
        self.t0 = time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.rewards.append(float(batch.rewards.mean()))
        self.lags += [int(info["policy_lag_max"]) for info in batch.infos]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        accepted = trainer.callback_metrics.get(ACCEPTANCE)
        if accepted is not None:
            self.acceptance.append(float(accepted))
        if time.perf_counter() - self.t0 >= self.seconds:
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module) -> None:
        self.t1 = time.perf_counter()


def policy_of(model: Mapping[str, Any]) -> Any:
    """The random-init policy of a `model_cfg` mapping (its other `model` keys as declared)."""
    keys = declared_arguments(ModelConfig, name_or_path=None, config=model["config"])
    return build_policy(**keys, seed=model.get("seed", 0))


def time_update_s(
    model: Mapping[str, Any], batch_size: int, seq_len: int, repeats: int = 3
) -> float:
    """Median seconds per fwd + bwd + AdamW step of `model` (a `model_cfg`-style mapping) on a
    synthetic [batch_size, seq_len] batch, after one warm-up step."""
    policy = policy_of(model)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    ids = torch.randint(0, 60, (batch_size, seq_len), generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        policy(input_ids=ids).logits.log_softmax(-1).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2]


def calibrate_update_s(args: argparse.Namespace, repeats: int = 3) -> float:
    """Seconds per fwd + bwd + AdamW step of the policy on a synthetic [B, 24] batch."""
    return time_update_s(model_cfg(args.hidden_size, args.num_layers), args.batch_size, 24, repeats)


def timed_pool(pool: RolloutPool, clock: Clock) -> RolloutPool:
    """Record how long the learner blocks in `next_batch`."""
    inner = pool.next_batch

    def next_batch(timeout: float | None = None):
        start = time.perf_counter()
        try:
            return inner(timeout)
        finally:
            clock.waits.append(time.perf_counter() - start)

    pool.next_batch = next_batch  # type: ignore[method-assign]
    return pool


def run_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    model = model_cfg(args.hidden_size, args.num_layers)
    module = build_learner(
        policy_of(model),
        OBJECTIVE,
        OPTIM,
        batch_size=args.batch_size,
        micro_batch_size=args.batch_size,
    )
    tokenizer, clock, pools = build_toy_tokenizer(), Clock(args.seconds), []

    def factory(**shard: Any) -> RolloutPool:
        engine = torch_engine(module.policy, max_batch_size=args.max_in_flight, seed=args.seed)
        cfg = agent_loop_config(max_turns=1, max_len=32, sampling=sampling_params(max_new_tokens=4))
        pool = RolloutPool(
            engine,
            lambda: SlowDigitEnv(args.latency_median, args.latency_sigma),
            tokenizer,
            cfg,
            task_sampler=SlowDigitEnv.task_sampler(
                median_s=args.latency_median, sigma=args.latency_sigma
            ),
            max_in_flight=args.max_in_flight if mode == "async" else args.batch_size,
            max_policy_lag=args.max_policy_lag,
            mode=mode,
            samples_per_prompt=1,
            max_prompt_retries=RolloutConfig.max_prompt_retries,
            off_policy_correction=True,
            num_env_workers=args.max_in_flight,
            **shard,
        )
        pools.append(pool)
        return timed_pool(pool, clock)

    dm = RolloutDataModule(factory, batch_size=args.batch_size, seed=args.seed, batch_timeout_s=300)
    trainer = L.Trainer(
        max_steps=100_000,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[WeightSyncCallback(sync_every=1), clock],
    )
    trainer.fit(module, datamodule=dm)
    stats = pools[0].stats()
    wall, steps = clock.t1 - clock.t0, len(clock.rewards)
    waits = clock.waits[:steps]
    return {
        "mode": mode,
        "updates": steps,
        "wall_s": round(wall, 2),
        "updates_per_min": round(60.0 * steps / wall, 2),
        "learner_idle": round(sum(waits) / wall, 3),
        "learner_idle_after_first": round(sum(waits[1:]) / (wall - waits[0]), 3),
        "lag_mean": round(sum(clock.lags) / max(1, len(clock.lags)), 2),
        "lag_max": max(clock.lags, default=0),
        "reward_first5": round(sum(clock.rewards[:5]) / max(1, len(clock.rewards[:5])), 3),
        "reward_last5": round(sum(clock.rewards[-5:]) / max(1, len(clock.rewards[-5:])), 3),
        "acceptance_mean": round(sum(clock.acceptance) / max(1, len(clock.acceptance)), 3),
        "paused_for_lag": stats["paused_for_lag"],
        "failed": stats["failed"],
        "rejected": stats["rejected"],
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=45.0, help="training time per mode")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-in-flight", type=int, default=64)
    p.add_argument("--max-policy-lag", type=int, default=4)
    p.add_argument(
        "--latency-median",
        type=float,
        default=None,
        help="env step median in seconds (default: --latency-ratio x update time)",
    )
    p.add_argument("--latency-ratio", type=float, default=0.3)
    p.add_argument("--latency-sigma", type=float, default=1.0, help="log-normal log-std")
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="intra-op threads (1: learner and engine threads get a core each)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    torch.set_num_threads(args.torch_threads)
    if args.latency_median is None:
        update_s = calibrate_update_s(args)
        args.latency_median = args.latency_ratio * update_s
        print(f"learner update ~{update_s:.3f} s -> env latency median {args.latency_median:.3f} s")
    results = {mode: run_mode(mode, args) for mode in ("async", "sync")}
    ratio = results["async"]["updates_per_min"] / results["sync"]["updates_per_min"]
    for r in results.values():
        print(
            f"{r['mode']:>5}: {r['updates_per_min']:7.1f} updates/min ({r['updates']} in "
            f"{r['wall_s']} s), learner idle {100 * r['learner_idle']:.1f}% "
            f"({100 * r['learner_idle_after_first']:.1f}% after the first batch), lag mean "
            f"{r['lag_mean']} max {r['lag_max']}, paused_for_lag {r['paused_for_lag']}; batch "
            f"reward first 5 updates {r['reward_first5']:.3f} -> last 5 {r['reward_last5']:.3f}, "
            f"trust-region acceptance mean {r['acceptance_mean']:.2f}"
        )
    print(
        f"async/sync update-rate ratio: {ratio:.2f} (target >= 2.0); async learner idle "
        f"{100 * results['async']['learner_idle']:.1f}% (target <= 20%)"
    )
    summary = {
        "ratio": round(ratio, 2),
        "latency_median_s": round(args.latency_median, 4),
        **results,
    }
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
