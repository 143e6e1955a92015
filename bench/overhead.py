"""What frlab costs over the maths: one learner update, and the whole toy pipeline.

`--part update`: one learner update of frlab (Lightning Trainer + `FlashReinforceModule`:
objective registry and validation, micro-batching, metrics, CSV logging) against a hand-written
PyTorch loop doing the same computation on the same model and batches: the same decoder
forward per micro-batch (padded rows, both), the same chunked LM-head log-probs
(`frlab.model.lm_logprobs.logprobs_from_hidden`), the FlashREINFORCE loss written out (batch-
mean baseline, token ratio, sequence Bernoulli-KL gate, sample mean), backward, grad-norm clip
and the same AdamW step. A step's time is the interval between consecutive batch starts (frlab:
everything Lightning does per step; hand loop: its loop body). Arms alternate in rounds in one
process; medians and the median of per-round ratios are printed. Target: frlab / hand <= 1.10.

`--part pipeline`: `experiment=toy_cpu rollout=sync` (collect B, then train: the parts add up)
for `--steps` updates through `frlab.train.run`, then, alone in the same process, the
generation of the same number of batches (the same pool and engine, no learner) and the
learner updates on those batches (no pool, no callbacks); the weight push to the engine
after each batch is timed on its own. Overhead fraction = (pipeline seconds per update -
generation alone - learner alone) / pipeline seconds per update, computed per round
(`--pipeline-rounds` rounds of pipeline, then the parts alone) and reported as the median of
the rounds with their spread, since one round's generation time varies by 2x on a shared
machine. Where the per-update time goes is read from a cProfile of one more pipeline run (main
thread only: the engine and environments run in their own threads).

Run: `python bench/overhead.py` (both parts) or `--part update` / `--part pipeline`.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import csv
import math
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from frlab.build import build_learner
from frlab.config.arguments import declared_arguments
from frlab.config.schema import ModelConfig
from frlab.data.batch import RolloutBatch, Trajectory, collate
from frlab.learner.module import FlashReinforceModule
from frlab.model.lm_logprobs import logprobs_from_hidden
from frlab.model.policy import build_policy, tiny_config

DELTA = 3e-3
OBJECTIVE = {
    "baseline": "batch_mean",
    "trust_region": "sequence_bernoulli_kl",
    "aggregation": "sample_mean",
    "token_filter": "none",
    "sequence_bernoulli_kl": {"delta": DELTA},
}
OPTIM = {
    "lr": 1e-5,
    "weight_decay": 0.1,
    "betas": [0.9, 0.999],
    "eps": 1e-8,
    "grad_clip": 1.0,
    "scheduler": "constant",
}
SMALL_QWEN2 = {
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
}


# --------------------------------------------------------------------------- the update


def make_batches(model: torch.nn.Module, args: argparse.Namespace) -> list[RolloutBatch]:
    """`--steps` + 1 batches of B rows, log-normal lengths, behaviour = the model's own."""
    gen = torch.Generator().manual_seed(0)
    vocab, batches = model.config.vocab_size, []
    for _ in range(args.steps + 1):
        raw = (torch.randn(args.batch, generator=gen) * 0.5 + math.log(args.median)).exp()
        trajectories = []
        for i, n in enumerate(raw.round().clamp(16, 4 * args.median).long().tolist()):
            prompt = n // 5
            trajectories.append(
                Trajectory(
                    token_ids=torch.randint(0, vocab, (n,), generator=gen).tolist(),
                    action_mask=[False] * prompt + [True] * (n - prompt),
                    behavior_log_probs=[0.0] * prompt + [-1.0] * (n - prompt),
                    token_versions=[-1] * prompt + [0] * (n - prompt),
                    reward=float(torch.rand((), generator=gen) < 0.5),
                    prompt_id=i,
                )
            )
        batch = collate(trajectories)
        with torch.no_grad():
            lp, _ = hand_logprobs(model, batch)
        noise = 0.02 * torch.randn(lp.shape, generator=gen, dtype=lp.dtype)
        behavior = torch.where(batch.action_mask, (lp + noise).clamp(max=-1e-4), 0.0)
        batch.behavior_log_probs = behavior.float()
        batches.append(batch)
    return batches


def hand_logprobs(model: torch.nn.Module, mb: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [b, T] of the policy tokens (0 elsewhere) and the scored mask [b, T - 1]."""
    out = model.model(
        input_ids=mb.input_ids,
        attention_mask=mb.attention_mask.long(),
        position_ids=mb.position_ids,
        use_cache=False,
    )
    score = mb.action_mask[:, 1:]
    head = model.lm_head
    logp, _ = logprobs_from_hidden(
        out.last_hidden_state[:, :-1][score],
        head.weight,
        mb.input_ids[:, 1:][score],
        chunk_size=1024,
    )
    return F.pad(logp.new_zeros(score.shape).masked_scatter(score, logp), (1, 0)), score


def hand_update(model, optimizer, batch: RolloutBatch, micro: int) -> None:
    """The FlashREINFORCE update written out: one AdamW step over padded micro-batches."""
    optimizer.zero_grad(set_to_none=True)
    b = batch.batch_size
    advantages = batch.rewards - batch.rewards.mean()
    for start in range(0, b, micro):
        mb = batch.select(slice(start, start + micro)).trim()
        lp, _ = hand_logprobs(model, mb)
        mask, behavior = mb.action_mask, mb.behavior_log_probs.to(lp.dtype)
        current = lp.detach()
        rho = torch.exp(torch.where(mask, current - behavior, 0.0))
        p = behavior.exp().clamp(1e-6, 1 - 1e-6)
        q = current.exp().clamp(1e-6, 1 - 1e-6)
        kl = p * (p.log() - q.log()) + (1 - p) * ((1 - p).log() - (1 - q).log())
        lengths = mask.sum(dim=1)
        admitted = (torch.where(mask, kl, 0.0).sum(1) / lengths).clamp_min(0) <= DELTA
        a = advantages[start : start + micro].to(lp.dtype)
        terms = torch.where(mask & admitted[:, None], -rho * a[:, None] * lp, 0.0)
        ((terms.sum(dim=1) / lengths).sum() / b).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIM["grad_clip"])
    optimizer.step()


class BatchClock(L.Callback):
    """Start time of every training batch."""

    def __init__(self) -> None:
        self.starts: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.starts.append(time.perf_counter())


def frlab_steps(model, batches, args, log_dir: Path) -> list[float]:
    module = build_learner(
        model,
        OBJECTIVE,
        OPTIM,
        batch_size=args.batch,
        micro_batch_size=args.micro,
        pack_sequences=False,
    )
    clock = BatchClock()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=len(batches),
        callbacks=[clock],
        logger=L.pytorch.loggers.CSVLogger(log_dir),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    trainer.fit(module, DataLoader(batches, batch_size=None))
    return [b - a for a, b in zip(clock.starts, clock.starts[1:], strict=False)]


def hand_steps(model, batches, args) -> list[float]:
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=OPTIM["lr"],
        betas=tuple(OPTIM["betas"]),
        eps=OPTIM["eps"],
        weight_decay=OPTIM["weight_decay"],
    )
    starts = []
    for batch in batches:
        starts.append(time.perf_counter())
        hand_update(model, optimizer, batch, args.micro)
    return [b - a for a, b in zip(starts, starts[1:], strict=False)]


def part_update(args: argparse.Namespace) -> None:
    base = build_policy(
        **declared_arguments(
            ModelConfig, name_or_path=None, config=tiny_config("qwen2", **SMALL_QWEN2)
        ),
        seed=0,
    ).train()
    batches = make_batches(base, args)
    tokens = sum(int(b.attention_mask.sum()) for b in batches[1:]) / (len(batches) - 1)
    print(
        f"update: qwen2 {sum(p.numel() for p in base.parameters()) / 1e6:.1f}M params, "
        f"B={args.batch}, {tokens:.0f} tokens per batch, micro-batches of {args.micro} rows, "
        f"{args.steps} timed steps x {args.rounds} rounds, {torch.get_num_threads()} threads"
    )
    frlab_t, hand_t, ratios = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds + 1):
            f = frlab_steps(copy.deepcopy(base), batches, args, Path(tmp) / str(round_))
            h = hand_steps(copy.deepcopy(base), batches, args)
            if round_ == 0:
                continue  # warm-up
            frlab_t += f
            hand_t += h
            ratios.append(statistics.median(f) / statistics.median(h))
            print(
                f"round {round_}: frlab {statistics.median(f):.3f} s/step, "
                f"hand {statistics.median(h):.3f} s/step",
                flush=True,
            )
    fm, hm = statistics.median(frlab_t), statistics.median(hand_t)
    print(
        f"frlab {fm:.3f} s/update, hand-written {hm:.3f} s/update: "
        f"{statistics.median(ratios):.3f}x (median of per-round ratios; target <= 1.10)"
    )


# --------------------------------------------------------------------------- the pipeline


def pipeline_overrides(args: argparse.Namespace, out: Path) -> list[str]:
    return [
        "experiment=toy_cpu",
        "rollout=sync",
        f"trainer.max_steps={args.pipeline_steps}",
        "plots=false",
        f"paths.output_dir={out}",
    ]


def run_pipeline(args: argparse.Namespace, out: Path, profile: cProfile.Profile | None):
    from frlab.config.compose import compose
    from frlab.train import run

    cfg = compose(pipeline_overrides(args, out))
    if profile is not None:
        profile.enable()
    try:
        run(cfg)
    finally:
        if profile is not None:
            profile.disable()
    with (out / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    elapsed = [float(r["elapsed_s"]) for r in rows]
    learner = [float(r["timing/step_s"]) for r in rows]
    return cfg, [b - a for a, b in zip(elapsed, elapsed[1:], strict=False)], learner


def alone(cfg, args: argparse.Namespace) -> tuple[list[float], list[float], list[float]]:
    """Seconds per batch of the pool alone (and per weight push to its engine), then per
    update of the learner alone."""
    from frlab.config.compose import instantiate
    from frlab.config.preflight import check_config
    from frlab.learner import LearnerSettings
    from frlab.model.toy_tokenizer import build_toy_tokenizer
    from frlab.rollout.pool.factory import env_factory, pool_factory, task_sampler_factory
    from frlab.train import build_policy_from, plain

    checked = check_config(cfg)
    data = checked.sections["data"]
    policy = build_policy_from(checked.sections["model"], int(cfg.seed))
    module = FlashReinforceModule(
        policy,
        checked.objective,
        instantiate(cfg.optim, key="optim"),
        LearnerSettings.from_sections(checked.sections),
    )
    tokenizer = build_toy_tokenizer()
    engine = instantiate(cfg.rollout.engine, key="rollout.engine")
    pool = pool_factory(
        plain(cfg.rollout),
        policy,
        tokenizer,
        engine,
        env_factory(cfg.env),
        task_sampler_factory(cfg.env),
        off_policy_correction=True,
    )(batch_size=data["batch_size"], seed=0)
    pool.start()
    gen, sync, batches = [], [], []
    try:
        for step in range(args.pipeline_steps):
            start = time.perf_counter()
            trajectories = pool.next_batch(120.0)
            gen.append(time.perf_counter() - start)
            batches.append(collate(trajectories, int(tokenizer.pad_token_id)))
            start = time.perf_counter()  # what WeightSyncCallback does after an update
            pool.set_learner_version(step + 1)
            pool.update_weights(policy.state_dict(), step + 1)
            sync.append(time.perf_counter() - start)
    finally:
        pool.stop()
    clock = BatchClock()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=len(batches),
        callbacks=[clock],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, DataLoader(batches, batch_size=None))
    learn = [b - a for a, b in zip(clock.starts, clock.starts[1:], strict=False)]
    return gen[1:], sync[1:], learn


def attribution(profile: cProfile.Profile, steps: int) -> list[tuple[str, float]]:
    """Main-thread seconds per update in the pipeline's main parts (cumulative times)."""
    stats = pstats.Stats(profile)
    parts = {
        "wait for the batch (generation)": ("pool/pool.py", "next_batch"),
        "collate": ("batch.py", "collate"),
        "learner training_step": ("module.py", "training_step"),
        "weight sync to the engine": ("callbacks.py", "on_train_batch_end"),
        "metrics.csv / summary writer": ("run_files.py", "on_train_batch_end"),
        "Lightning logging": ("logger_connector.py", "update_train_step_metrics"),
        "metrics to the loggers (StepLog.flush)": ("step_log.py", "flush"),
    }
    found = {name: 0.0 for name in parts}
    total = 0.0
    for (file, _, func), (_, _, _, cum, _) in stats.stats.items():  # type: ignore[attr-defined]
        if file.endswith("lightning/pytorch/trainer/trainer.py") and func == "fit":
            total = max(total, cum)
        for name, (suffix, fn) in parts.items():
            if file.endswith(suffix) and func == fn:
                found[name] = max(found[name], cum)
    found["rest of Trainer.fit (start-up, hooks)"] = total - sum(found.values())
    return [(name, t / steps) for name, t in found.items()]


def pipeline_round(args: argparse.Namespace, out: Path) -> dict[str, float]:
    """One round: the pipeline, then its generation, weight push and learner alone (medians
    of the round's updates, the first left out as warm-up)."""
    cfg, wall, learner_in = run_pipeline(args, out, None)
    gen, sync, learn = alone(cfg, args)
    per_update = statistics.median(wall[1:])
    g, lrn, w = statistics.median(gen), statistics.median(learn), statistics.median(sync)
    return {
        "update": per_update,
        "learner_in": statistics.median(learner_in[1:]),
        "gen": g,
        "learn": lrn,
        "push": w,
        "overhead": (per_update - g - lrn) / per_update,
    }


def part_pipeline(args: argparse.Namespace) -> None:
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pipeline_rounds):
            r = pipeline_round(args, Path(tmp) / f"round{i}")
            rounds.append(r)
            print(
                f"round {i}: pipeline {r['update']:.4f} s/update (learner step inside it "
                f"{r['learner_in']:.4f} s); alone: generation {r['gen']:.4f} s/batch, learner "
                f"{r['learn']:.4f} s/update, weight push {r['push']:.4f} s; overhead "
                f"{100 * r['overhead']:.1f}%",
                flush=True,
            )
        profile = cProfile.Profile()
        _, wall_p, _ = run_pipeline(args, Path(tmp) / "profiled", profile)
    share = sorted(r["overhead"] for r in rounds)
    push = statistics.median(r["push"] / r["update"] for r in rounds)
    print(
        f"pipeline (toy_cpu, rollout=sync, {args.pipeline_steps} updates x "
        f"{len(rounds)} rounds): overhead {100 * statistics.median(share):.1f}% of the "
        f"pipeline's time per update (median of rounds; range {100 * share[0]:.1f}% to "
        f"{100 * share[-1]:.1f}%), of which the weight push {100 * push:.1f}%"
    )
    print(
        f"where the main thread's time goes, Trainer.fit / updates (cProfile run, median "
        f"{statistics.median(wall_p[1:]):.4f} s/update under the profiler):"
    )
    for name, seconds in attribution(profile, args.pipeline_steps):
        print(f"  {name:34s} {seconds:.4f} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("update", "pipeline", "both"), default="both")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--median", type=int, default=128, help="median trajectory length")
    parser.add_argument("--micro", type=int, default=8, help="rows per micro-batch (both arms)")
    parser.add_argument("--steps", type=int, default=4, help="timed updates per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pipeline-steps", type=int, default=40)
    parser.add_argument("--pipeline-rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import logging

    logging.getLogger("lightning").setLevel(logging.ERROR)
    if args.part in ("update", "both"):
        part_update(args)
    if args.part in ("pipeline", "both"):
        part_pipeline(args)


if __name__ == "__main__":
    sys.exit(main())
