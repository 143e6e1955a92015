"""GPU check: a few asynchronous FlashREINFORCE updates at Qwen2.5-0.5B's shape, timed.

The FlashREINFORCE update loop (paper, Sec. 3): the rollout pool keeps one rollout per prompt in
flight on the torch engine (its own bf16 copy of the weights, sampling in a background
thread), the learner (`FlashReinforceModule` under a Lightning Trainer, bf16-mixed) takes the
first B finished trajectories, makes one optimizer step, and `WeightSyncCallback` pushes the
new weights to the engine. The model is random-init (no download); the environment is a
one-turn task whose reward is a coin flip drawn with the task: this check measures speed and
plumbing, not learning.

Printed (after the first, warm-up update):
  rollout_tokens_per_s  sampled tokens delivered to the learner per second of wall time
                        (the engine shares the GPU with the learner, as in a real async run);
  learner_tokens_per_s  non-pad tokens (prompt + response) per second of `training_step`
                        (forward, backward and optimizer step);
  step_time_s           wall time per update (waiting for data + training + weight sync).
Exit status 1 when a number is not finite, a rollout failed or the weights never reached the
engine. `--tiny --device cpu` runs the same path with a tiny model (the CPU test does that).
"""

from __future__ import annotations

import argparse
import copy
import math
import random
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # runs from a checkout: frlab need not be pip-installed
    sys.path.insert(0, str(REPO))

import lightning as L  # noqa: E402
import torch  # noqa: E402

from envs.base import Env, StepResult  # noqa: E402
from frlab.build import build_learner  # noqa: E402
from frlab.config.arguments import declared_arguments  # noqa: E402
from frlab.config.schema import ModelConfig, RolloutConfig  # noqa: E402
from frlab.defaults import agent_loop_config, sampling_params, torch_engine  # noqa: E402
from frlab.objective.presets import PRESETS  # noqa: E402

# Qwen2.5-0.5B's shape (494M parameters with tied embeddings).
QWEN25_0P5B: dict[str, Any] = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
}
OBJECTIVE = {**PRESETS["flashreinforce"], "sequence_bernoulli_kl": {"delta": 3e-3}}
OPTIM = {"lr": 1e-6, "weight_decay": 0.1, "grad_clip": 1.0, "scheduler": "constant"}
PROMPT_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 "
THROUGHPUT_KEYS = ("rollout_tokens_per_s", "learner_tokens_per_s", "step_time_s")


class CoinFlipEnv(Env):
    """One turn: the prompt is `prompt_chars` random characters, the reward a coin flip
    drawn with the task (a random-init policy's text carries no signal to grade)."""

    def __init__(self, prompt_chars: int = 64) -> None:
        self.prompt_chars = int(prompt_chars)
        self._reward: float | None = None

    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        text = "".join(rng.choice(PROMPT_ALPHABET) for _ in range(self.prompt_chars))
        return {"text": text, "reward": float(rng.random() < 0.5)}

    def reset(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        self._reward = float(task["reward"])
        return [{"role": "user", "content": str(task["text"])}]

    def step(self, action_text: str) -> StepResult:
        if self._reward is None:
            raise RuntimeError("CoinFlipEnv.step called before reset")
        reward, self._reward = self._reward, None
        return StepResult(observation=None, reward=reward, done=True, info={})


@dataclass
class StepRecord:
    """One update as the learner saw it."""

    wall_s: float  # since the previous update ended (or training started)
    learner_s: float  # training_step: forward, backward, optimizer step
    sampled_tokens: int  # action tokens in the batch
    trained_tokens: int  # non-pad tokens the learner scored (prompt + response)
    reward_mean: float
    lag_max: int


def summarize(records: Sequence[StepRecord], warmup: int = 1) -> dict[str, float]:
    """Throughput over the updates after `warmup` (all of them when there are no more)."""
    if not records:
        raise ValueError("summarize needs at least one StepRecord")
    timed = list(records[warmup:]) or list(records)
    wall = sum(r.wall_s for r in timed)
    learner = sum(r.learner_s for r in timed)
    return {
        "rollout_tokens_per_s": sum(r.sampled_tokens for r in timed) / wall,
        "learner_tokens_per_s": sum(r.trained_tokens for r in timed) / learner,
        "step_time_s": wall / len(timed),
        "learner_step_s": learner / len(timed),
        "learner_idle_frac": 1.0 - learner / wall,
        "timed_steps": float(len(timed)),
    }


class Meter(L.Callback):
    """Times each update; keep it FIRST in the callbacks so `learner_s` excludes weight sync."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.records: list[StepRecord] = []
        self.pool_stats: dict[str, Any] = {}
        self._last_end = self._start = 0.0

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_end = self._now()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, i: int) -> None:
        self._start = self._now()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, i: int
    ) -> None:
        end = self._now()
        lags = [int(info.get("policy_lag_max", 0)) for info in batch.infos]
        self.records.append(
            StepRecord(
                wall_s=end - self._last_end,
                learner_s=end - self._start,
                sampled_tokens=int(batch.action_mask.sum()),
                trained_tokens=int(batch.attention_mask.sum()),
                reward_mean=float(batch.rewards.float().mean()),
                lag_max=max(lags, default=0),
            )
        )
        self._last_end = end

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pool = getattr(trainer.datamodule, "pool", None)
        self.pool_stats = pool.stats() if pool is not None else {}


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return number


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=_positive, default=8, help="optimizer updates (first = warm-up)")
    p.add_argument("--batch-size", type=_positive, default=32, help="B trajectories per update")
    p.add_argument("--new-tokens", type=_positive, default=256, help="sampled tokens per rollout")
    p.add_argument("--prompt-chars", type=_positive, default=64, help="prompt length (characters)")
    p.add_argument("--max-policy-lag", type=int, default=2, help="rollout.max_policy_lag")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    p.add_argument("--tiny", action="store_true", help="tiny 2-layer model (CPU test)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        args.device = torch.device(args.device)
    except RuntimeError as exc:
        p.error(f"--device {args.device!r}: {exc}")
    if args.device.type not in ("cuda", "cpu"):
        p.error(f"--device must be cuda, cuda:N or cpu, got {args.device}")
    if args.device.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {args.device}: torch.cuda.is_available() is False (use --device cpu)")
    if args.max_policy_lag < 1:
        p.error(
            f"--max-policy-lag must be >= 1 (weights sync every step), got {args.max_policy_lag}"
        )
    return args


def model_config(tiny: bool) -> Any:
    """Qwen2.5-0.5B's shape, or frlab's tiny qwen2 (hidden 64, 2 layers) for CPU."""
    from frlab.model.policy import tiny_config

    return tiny_config("qwen2") if tiny else tiny_config("qwen2", **QWEN25_0P5B)


def build_run(args: argparse.Namespace) -> tuple[Any, Any, Meter, list[Any], L.Trainer]:
    """The learner module, the DataModule (pool + engine), the meter, engines and trainer."""
    from frlab.data.datamodule import RolloutDataModule
    from frlab.model.policy import build_policy
    from frlab.model.toy_tokenizer import build_toy_tokenizer
    from frlab.rollout.callbacks import WeightSyncCallback
    from frlab.rollout.pool import RolloutPool

    cuda = args.device.type == "cuda"
    policy = build_policy(
        **declared_arguments(
            ModelConfig, name_or_path=None, config=model_config(args.tiny), dtype="float32"
        ),
        seed=args.seed,
    )
    module = build_learner(
        policy,
        OBJECTIVE,
        OPTIM,
        batch_size=args.batch_size,
        micro_batch_size=args.batch_size,
        max_steps=args.steps,
    )
    tokenizer, engines = build_toy_tokenizer(), []
    sampling = sampling_params(temperature=1.0, max_new_tokens=args.new_tokens)
    loop = agent_loop_config(
        max_turns=1, max_len=args.prompt_chars + 8 + args.new_tokens, sampling=sampling
    )
    in_flight = 2 * args.batch_size

    def make_pool(*, batch_size: int, seed: int, **shard: Any) -> RolloutPool:
        weights = copy.deepcopy(module.policy).to(torch.bfloat16 if cuda else torch.float32)
        engine = torch_engine(weights, device=args.device, max_batch_size=in_flight, seed=seed)
        engines.append(engine)
        return RolloutPool(
            engine,
            lambda: CoinFlipEnv(args.prompt_chars),
            tokenizer,
            loop,
            task_sampler=CoinFlipEnv.task_sampler(prompt_chars=args.prompt_chars),
            batch_size=batch_size,
            max_in_flight=in_flight,
            max_policy_lag=args.max_policy_lag,
            mode="async",
            samples_per_prompt=1,
            max_prompt_retries=RolloutConfig.max_prompt_retries,
            off_policy_correction=True,
            seed=seed,
            **shard,
        )

    datamodule = RolloutDataModule(
        make_pool,
        batch_size=args.batch_size,
        seed=args.seed,
        pad_token_id=int(tokenizer.pad_token_id),
        batch_timeout_s=240.0,
    )
    meter = Meter(args.device)
    trainer = L.Trainer(
        max_steps=args.steps,
        accelerator="gpu" if cuda else "cpu",
        devices=[args.device.index or 0] if cuda else 1,
        precision="bf16-mixed" if cuda else "32-true",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[meter, WeightSyncCallback(sync_every=1)],
    )
    return module, datamodule, meter, engines, trainer


def report(values: Mapping[str, float], extra: Mapping[str, Any]) -> None:
    for key, value in values.items():
        print(f"{key}: {value:.6g}")
    for key, value in extra.items():
        print(f"{key}: {value}")


def check(records: list[StepRecord], meter: Meter, engines: list[Any], steps: int) -> list[str]:
    """Problems that make the check fail (empty list: passed)."""
    problems = []
    if len(records) != steps:
        problems.append(f"{len(records)} updates recorded, expected {steps}")
    if not engines or engines[0].version != steps:
        version = engines[0].version if engines else None
        problems.append(f"engine weight version {version} != {steps}: weight sync not applied")
    failed = meter.pool_stats.get("failed", 0) + meter.pool_stats.get("rejected", 0)
    if failed:
        problems.append(f"{failed} rollouts failed or were rejected: {meter.pool_stats}")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    for pattern in (
        r".*LeafSpec",
        r".*`IterableDataset` has `__len__`",
        r".*overridden `transfer_batch_to_device`",
    ):
        warnings.filterwarnings("ignore", message=pattern)
    started = time.perf_counter()
    module, datamodule, meter, engines, trainer = build_run(args)
    params = sum(p.numel() for p in module.policy.parameters())
    name = "tiny qwen2" if args.tiny else "Qwen2.5-0.5B shape"
    gpu = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "cpu"
    print(f"model: {name}, {params / 1e6:.1f}M params, random init; device: {gpu}")
    print(
        f"B={args.batch_size} new_tokens={args.new_tokens} prompt_chars={args.prompt_chars} "
        f"steps={args.steps} max_policy_lag={args.max_policy_lag}"
    )
    trainer.fit(module, datamodule=datamodule)
    values = summarize(meter.records)
    extra: dict[str, Any] = {
        "reward_mean": round(sum(r.reward_mean for r in meter.records) / len(meter.records), 4),
        "policy_lag_max": max(r.lag_max for r in meter.records),
        "engine_version": engines[0].version if engines else None,
        "total_s": round(time.perf_counter() - started, 1),
    }
    if args.device.type == "cuda":
        extra["peak_gpu_mem_gib"] = round(torch.cuda.max_memory_allocated(args.device) / 2**30, 2)
    report(values, extra)
    problems = check(meter.records, meter, engines, args.steps)
    problems += [f"{k} is not finite" for k, v in values.items() if not math.isfinite(v)]
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    print("gpu_check: " + ("FAILED" if problems else "OK"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
