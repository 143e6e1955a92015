"""Wall-clock time to reward: async one-rollout-per-prompt vs sync and GRPO groups.

FlashREINFORCE's promise is wall-clock: with heavy-tailed episode durations, collecting one
rollout per prompt asynchronously reaches a given reward sooner than collecting "B, then
train" or GRPO groups. Four arms run the SAME learnable task, model and optimizer:

- `async`      FlashREINFORCE: `flashreinforce` objective, G=1, asynchronous pool
- `sync`       the same objective and G=1, collect B then train
- `grpo_sync`  frlab's `grpo` objective (group mean/std baseline, PPO clip), G groups, sync
- `grpo_async` the same GRPO objective and groups in the asynchronous pool

The task, model and optimizer are those of the CPU preset `experiment=toy_cpu` (read from its
files): `envs.toy.ParityEnv` (reply with a digit of the last digit's parity), a random-init
Qwen2 (hidden 64, 2 layers), AdamW lr 1e-3 constant, B=64, temperature 1, 4 new tokens, lag
bound 2; the async arms keep 2B rollouts in flight, so that the first B finishers need not
include the slowest. Every episode's environment step sleeps a log-normal time drawn per
EPISODE (median `--latency-median` s, or `--latency-ratio` (default 1) x the learner's update
time measured alone on synthetic batches; log-std `--latency-sigma`), so the G samples of a
prompt finish at different times, as agentic episodes do.

A run ends when the moving average of batch reward over `--window` updates first reaches
`--target` (its time to reward: seconds since training started) or at `--time-cap` seconds
(CENSORED: the cap stands in for it in the medians, and a median so affected is a lower bound).
Seeds run interleaved (seed 0 of every arm, then seed 1, ...) so machine load drifts hit all
arms alike. Each run's line also splits the learner's idle time: the share held back only by
the lag bound (`timing/lag_wait_s`: B finished trajectories ready, rollouts due in this batch
still running) against the rest (generation throughput). Printed: arguments, CPU count and
load averages, each run, medians per arm and the ratios of each arm's median to `async`'s
(target: sync/async >= 2.0, GRPO arms > 1).

Engine: every arm uses `--engine` (`process`, the default: `rollout/engine=torch_process`,
generation in a child process with the weights in shared memory, so it runs on its own core;
`thread`: the in-process `torch` engine, whose thread shares the learner's interpreter lock).
The extra arm `async_thread` is `async` on the in-process engine whatever `--engine` says, for
an interleaved A/B of the two engines (`--arms async,async_thread`).

    python bench/time_to_reward.py --seeds 5 --target 0.8 --window 10 --time-cap 75
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from async_pipeline import Clock, time_update_s, timed_pool  # noqa: E402
from ttr_stats import RewardWindow, ratio, summarize  # noqa: E402

from envs.base import StepResult  # noqa: E402
from envs.toy import ParityEnv  # noqa: E402
from frlab.config.schema import RolloutConfig  # noqa: E402
from frlab.data.datamodule import RolloutDataModule  # noqa: E402
from frlab.defaults import agent_loop_config, process_engine, sampling_params, torch_engine
from frlab.learner.metrics import STEP_S  # noqa: E402
from frlab.learner.module import FlashReinforceModule  # noqa: E402
from frlab.model.toy_tokenizer import build_toy_tokenizer  # noqa: E402
from frlab.objective.presets import PRESETS  # noqa: E402
from frlab.rollout.callbacks import WeightSyncCallback  # noqa: E402
from frlab.rollout.pool import RolloutPool  # noqa: E402
from frlab.rollout.pool.metering import LAG_WAIT_S  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PRESET = OmegaConf.load(ROOT / "experiments/experiment/toy_cpu.yaml")
TOY_MODEL = OmegaConf.to_container(OmegaConf.load(ROOT / "configs/model/toy_qwen2.yaml"))
TOY_ENV = OmegaConf.load(ROOT / "configs/env/toy_single.yaml")


@dataclass(frozen=True)
class Arm:
    """One way of collecting and training: pool mode, objective preset, samples per prompt, and
    the engine when the arm fixes it (None: `--engine`)."""

    mode: str
    objective: str
    group: bool
    engine: str | None = None


ARMS = {
    "async": Arm("async", "flashreinforce", False),
    "sync": Arm("sync", "flashreinforce", False),
    "grpo_sync": Arm("sync", "grpo", True),
    "grpo_async": Arm("async", "grpo", True),
    # not in the default arms: `async` on the in-process engine, for an interleaved A/B
    "async_thread": Arm("async", "flashreinforce", False, "thread"),
}
DEFAULT_ARMS = ("async", "sync", "grpo_sync", "grpo_async")


class Latencies:
    """Thread-safe seeded source of log-normal episode latencies; remembers every draw."""

    def __init__(self, median_s: float, sigma: float, seed: int, cap_s: float = 30.0) -> None:
        self.mu, self.sigma, self.cap_s = math.log(median_s), sigma, cap_s
        self._rng, self._lock = random.Random(seed), threading.Lock()
        self.drawn: list[float] = []

    def draw(self) -> float:
        with self._lock:
            value = min(self.cap_s, self._rng.lognormvariate(self.mu, self.sigma))
            self.drawn.append(value)
            return value


class SlowParityEnv(ParityEnv):
    """`ParityEnv` whose one step first sleeps this episode's latency (in `info`)."""

    def __init__(self, latencies: Latencies, num_digits: int) -> None:
        super().__init__(num_digits)
        self.latency_s = latencies.draw()

    def step(self, action_text: str) -> StepResult:
        time.sleep(self.latency_s)
        result = super().step(action_text)
        return StepResult(
            result.observation,
            result.reward,
            result.done,
            {**result.info, "latency_s": self.latency_s},
        )


class Recorder(Clock):
    """`Clock` plus the time-to-reward detector: stops at the first crossing or at the cap."""

    def __init__(self, cap_s: float, window: int, target: float) -> None:
        super().__init__(cap_s)
        self.detector = RewardWindow(window, target)
        self.step_s: list[float] = []
        self.lag_wait_s: list[float] = []
        self.consumed_latency: list[float] = []

    def on_train_start(self, trainer, pl_module) -> None:
        if not self.t0:  # normally started with the pool (`run_arm`): async gets no head start
            super().on_train_start(trainer, pl_module)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        elapsed = time.perf_counter() - self.t0
        if elapsed <= self.seconds:  # a crossing after the cap counts as censored
            self.detector.add(elapsed, self.rewards[-1])
        self.consumed_latency += [float(i["env"]["latency_s"]) for i in batch.infos]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        step_s = trainer.callback_metrics.get(STEP_S)
        if step_s is not None:
            self.step_s.append(float(step_s))
        lag_wait = trainer.callback_metrics.get(LAG_WAIT_S)
        if lag_wait is not None:
            self.lag_wait_s.append(float(lag_wait))
        if self.detector.crossed_at is not None:
            trainer.should_stop = True


def objective(name: str) -> dict[str, Any]:
    """A preset's components plus the default hyperparameters of the ones that have some."""
    params = OmegaConf.to_container(OmegaConf.load(ROOT / "configs/objective/params/default.yaml"))
    chosen = PRESETS[name]
    return {**chosen, **{k: v for k, v in params.items() if k in chosen.values()}}


def run_arm(name: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Train one arm from scratch with `seed` until the target or the cap; its measurements."""
    arm, batch = ARMS[name], int(PRESET.data.batch_size)
    g = args.group_size if arm.group else 1
    in_flight = args.max_in_flight if arm.mode == "async" else batch
    module = FlashReinforceModule(
        {"config": TOY_MODEL["config"], "seed": seed},
        objective(arm.objective),
        OmegaConf.to_container(PRESET.optim),
        batch_size=batch,
        micro_batch_size=int(PRESET.data.micro_batch_size),
    )
    recorder = Recorder(args.time_cap, args.window, args.target)
    latencies = Latencies(args.latency_median, args.latency_sigma, seed)
    rollout, tokenizer = PRESET.rollout, build_toy_tokenizer()
    loop_cfg = agent_loop_config(
        max_turns=1, max_len=int(rollout.max_len), sampling=sampling_params(**rollout.sampling)
    )
    pools: list[RolloutPool] = []

    def factory(**shard: Any) -> RolloutPool:
        engine = make_engine(
            arm.engine or args.engine, module.policy, in_flight, seed, args.engine_threads
        )
        recorder.t0 = time.perf_counter()  # after the engine's one-off start (process spawn)
        pool = RolloutPool(
            engine,
            lambda: SlowParityEnv(latencies, int(args.num_digits)),
            tokenizer,
            loop_cfg,
            task_sampler=ParityEnv.task_sampler(num_digits=int(args.num_digits)),
            max_in_flight=in_flight,
            max_policy_lag=args.max_policy_lag,
            mode=arm.mode,
            samples_per_prompt=g,
            off_policy_correction=True,
            num_env_workers=in_flight,
            **shard,
            max_prompt_retries=RolloutConfig.max_prompt_retries,
        )
        pools.append(pool)
        return timed_pool(pool, recorder)

    dm = RolloutDataModule(factory, batch_size=batch, seed=seed, batch_timeout_s=300)
    trainer = L.Trainer(
        max_steps=1_000_000,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[WeightSyncCallback(sync_every=1), recorder],
    )
    trainer.fit(module, datamodule=dm)
    return measurements(name, seed, recorder, latencies, pools[0].stats())


def make_engine(kind: str, policy: Any, in_flight: int, seed: int, threads: int) -> Any:
    """`thread`: TorchEngine in the learner's process; `process`: ProcessTorchEngine (a child
    process on its own core, weights in shared memory). Started here."""
    if kind == "process":
        engine = process_engine(policy, max_batch_size=in_flight, seed=seed, num_threads=threads)
    else:
        engine = torch_engine(policy, max_batch_size=in_flight, seed=seed)
    engine.start()
    return engine


def measurements(
    name: str, seed: int, rec: Recorder, latencies: Latencies, stats: Mapping[str, Any]
) -> dict[str, Any]:
    """The per-run record printed and summarised."""
    det, wall = rec.detector, rec.t1 - rec.t0

    def mean(xs: list[float]) -> float:
        return statistics.fmean(xs) if xs else float("nan")

    return {
        "arm": name,
        "seed": seed,
        "time_to_target_s": det.crossed_at,
        "updates_to_target": det.crossed_update,
        "updates": len(rec.rewards),
        "wall_s": wall,
        "updates_per_min": 60.0 * len(rec.rewards) / wall,
        "reward_first10": mean(rec.rewards[:10]),
        "reward_last10": mean(rec.rewards[-10:]),
        "acceptance_mean": mean([a for a in rec.acceptance if math.isfinite(a)]),  # NaN: skipped
        "lag_mean": mean([float(x) for x in rec.lags]),
        "learner_step_s": statistics.median(rec.step_s) if rec.step_s else float("nan"),
        "learner_idle": sum(rec.waits[: len(rec.rewards)]) / wall if rec.waits else float("nan"),
        "learner_idle_lag_bound": sum(rec.lag_wait_s) / wall,
        "latency_consumed_mean_s": mean(rec.consumed_latency),
        "latency_drawn_mean_s": mean(latencies.drawn),
        "paused_for_lag": stats["paused_for_lag"],
        "failed": stats["failed"],
        "load1": os.getloadavg()[0],
    }


def run_line(r: Mapping[str, Any], cap_s: float) -> str:
    """One run, self-explanatory."""
    t, acceptance = r["time_to_target_s"], r["acceptance_mean"]
    acceptance = "n/a" if math.isnan(acceptance) else f"{acceptance:.2f}"  # PPO clip: none
    reached = (
        f"reached target at {t:6.1f} s (update {r['updates_to_target']})"
        if t is not None
        else f"CENSORED: not reached in {cap_s:.0f} s"
    )
    return (
        f"seed {r['seed']} {r['arm']:<10} {reached}; {r['updates']} updates "
        f"({r['updates_per_min']:.0f}/min, learner step {r['learner_step_s']:.3f} s, idle "
        f"{100 * r['learner_idle']:.0f}%, {100 * r['learner_idle_lag_bound']:.0f}% held by the "
        f"lag bound), reward first10 {r['reward_first10']:.2f} last10 "
        f"{r['reward_last10']:.2f}, acceptance {acceptance}, lag {r['lag_mean']:.2f}, "
        f"latency consumed/drawn mean {r['latency_consumed_mean_s']:.3f}/"
        f"{r['latency_drawn_mean_s']:.3f} s, load1 {r['load1']:.1f}"
    )


def summary(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Print medians per arm (censored seeds at the cap) and ratios to `async`; return them."""
    arms = {name: [r for r in runs if r["arm"] == name] for name in args.arms}
    medians = {
        n: summarize([r["time_to_target_s"] for r in rs], args.time_cap) for n, rs in arms.items()
    }
    print(
        f"\ntime to reward (moving average of {args.window} batch rewards >= {args.target}); "
        f"censored seeds count as the cap ({args.time_cap:.0f} s) in the medians"
    )
    print(
        f"{'arm':<11}{'median s':>9}{'censored':>9}{'updates':>8}{'upd/min':>8}{'lag':>5}"
        "   per seed (s)"
    )
    for name, rs in arms.items():
        m = medians[name]
        seeds = " ".join(
            f"{r['time_to_target_s']:.1f}"
            if r["time_to_target_s"] is not None
            else f">{args.time_cap:.0f}"
            for r in rs
        )
        upd = [r["updates_to_target"] for r in rs if r["updates_to_target"] is not None]
        upd_s = f"{statistics.median(upd):.0f}" if upd else "-"
        rate = statistics.median(r["updates_per_min"] for r in rs)
        lag = statistics.median(r["lag_mean"] for r in rs)
        flag = " (median: a lower bound)" if m.median_censored else ""
        print(
            f"{name:<11}{m.median_s:>9.1f}{m.censored:>5}/{m.runs:<3}{upd_s:>8}{rate:>8.0f}"
            f"{lag:>5.1f}   {seeds}{flag}"
        )
    print("(medians over seeds; updates: to the target, runs that reached it; upd/min: whole run)")
    ratios = {}
    if "async" in medians:
        for name in medians:
            if name != "async":
                value, how = ratio(medians[name], medians["async"])
                ratios[f"{name}/async"] = (round(value, 2), how)
                goal = ">= 2.0" if name == "sync" else "> 1.0"
                print(f"ratio of medians {name}/async: {READ[how]}{value:.2f} (target {goal})")
    return {n: asdict(m) for n, m in medians.items()} | {"ratios": ratios}


READ = {"=": "", ">=": "at least ", "<=": "at most ", "?": "unknown (both censored), "}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5, help="seeds per arm (0..N-1)")
    p.add_argument("--arms", default=",".join(DEFAULT_ARMS), help=f"comma list of {list(ARMS)}")
    p.add_argument("--target", type=float, default=0.8, help="moving-average reward to reach")
    p.add_argument("--window", type=int, default=10, help="updates in the moving average")
    p.add_argument("--time-cap", type=float, default=75.0, help="training seconds per run")
    p.add_argument(
        "--latency-median",
        type=float,
        default=None,
        help="env step median in seconds (default: --latency-ratio x update time)",
    )
    p.add_argument("--latency-ratio", type=float, default=1.0)
    p.add_argument("--latency-sigma", type=float, default=1.0, help="log-normal log-std")
    p.add_argument(
        "--max-in-flight",
        type=int,
        default=2 * int(PRESET.data.batch_size),
        help="async arms (sync: B)",
    )
    p.add_argument(
        "--max-policy-lag",
        type=int,
        default=int(PRESET.rollout.max_policy_lag),
        help="lag bound (the preset's)",
    )
    p.add_argument("--group-size", type=int, default=4, help="G of the GRPO arms")
    p.add_argument("--num-digits", type=int, default=int(TOY_ENV.num_digits))
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument(
        "--engine",
        choices=("thread", "process"),
        default="process",
        help="torch engine in the learner's process or in a child process",
    )
    p.add_argument("--engine-threads", type=int, default=1, help="--engine process: its threads")
    args = p.parse_args(argv)
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in args.arms if a not in ARMS]
    if bad or args.seeds < 1 or args.time_cap <= 0:
        p.error(f"--arms must name {list(ARMS)} (got {bad}); --seeds >= 1; --time-cap > 0")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    torch.set_num_threads(args.torch_threads)
    load_start = os.getloadavg()
    batch = int(PRESET.data.batch_size)
    update_s = time_update_s({"config": TOY_MODEL["config"], "seed": 0}, batch, 20)
    if args.latency_median is None:
        args.latency_median = args.latency_ratio * update_s
    print(
        f"machine: {os.cpu_count()} CPUs, load average {load_start} at start; torch threads "
        f"{args.torch_threads}\narguments: {vars(args)}\nsynthetic learner update "
        f"(B={batch}, 20 tokens) {update_s:.4f} s -> env latency per episode log-normal, "
        f"median {args.latency_median:.4f} s, sigma {args.latency_sigma}"
    )
    runs = []
    for seed in range(args.seeds):
        for name in args.arms:
            runs.append(run_arm(name, seed, args))
            print(run_line(runs[-1], args.time_cap), flush=True)
    result = summary(runs, args)
    print(f"load average {load_start} at start, {os.getloadavg()} at end")
    out = {
        "args": vars(args),
        "update_s": update_s,
        "load_start": load_start,
        "load_end": os.getloadavg(),
        "summary": result,
        "runs": runs,
    }
    print(json.dumps(out, default=str))
    return out


if __name__ == "__main__":
    main()
