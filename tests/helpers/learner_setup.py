"""Shared helpers for the learner tests and the DDP worker script.

Batches are built here, not by a rollout engine: random token ids with prompt, policy and
(for multi-turn rows) observation segments; behaviour log-probs are the policy's own naive
log-probs plus a per-row perturbation (so the trust-region gate admits some rows and rejects
others); rewards are 0/1 (their batch mean is exact in binary floating point).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader, IterableDataset

from frlab.data.batch import RolloutBatch, Trajectory, collate
from frlab.model.policy import tiny_config
from helpers.models import policy_of
from helpers.tiny import tiny_qwen2_config

VOCAB = 96
DELTA = 2e-3
NOISE_SCALES = (0.0, 0.05, 1.0, 3.0)

MODEL_CFG: dict[str, Any] = {
    "name_or_path": None,
    "config": tiny_qwen2_config(vocab_size=VOCAB, tie_word_embeddings=False),
    "tokenizer": "toy",
    "dtype": "float32",
    "gradient_checkpointing": False,
    "logprob_chunk_size": 5,
    "routing_replay": False,
}

OBJECTIVE_CFG: dict[str, Any] = {
    "baseline": "batch_mean",
    "trust_region": "sequence_bernoulli_kl",
    "aggregation": "sample_mean",
    "token_filter": "none",
    "sequence_bernoulli_kl": {"delta": DELTA},
}

OPTIM_CFG: dict[str, Any] = {
    "lr": 1e-2,
    "weight_decay": 0.1,
    "betas": [0.9, 0.99],
    "eps": 1e-8,
    "grad_clip": 0.05,
    "scheduler": "constant",
    "warmup_ratio": 0.0,
    "min_lr_ratio": 0.0,
}


def tiny_policy(seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    """A random-init 2-layer Qwen2 (hidden 32, vocab 96), float64 by default for exact parity."""
    cfg = tiny_config(
        "qwen2", **{k: v for k, v in MODEL_CFG["config"].items() if k != "model_type"}
    )
    return policy_of(config=cfg, seed=seed).to(dtype)


def naive_logprobs_and_entropies(
    policy: torch.nn.Module, batch: RolloutBatch, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Full [B,T,V] logits -> log_softmax -> gather (and the full entropy), aligned with ids."""
    out = policy(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask.long(),
        position_ids=batch.position_ids,
        use_cache=False,
    )
    log_softmax = F.log_softmax(out.logits[:, :-1].to(torch.float64) / temperature, dim=-1)
    picked = log_softmax.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(dim=-1).detach()
    return F.pad(picked, (1, 0)), F.pad(entropy, (1, 0))


def naive_logprobs(policy: torch.nn.Module, batch: RolloutBatch, temperature: float = 1.0):
    """Position t = log p(token t | < t) from full logits (position 0 = 0)."""
    return naive_logprobs_and_entropies(policy, batch, temperature)[0]


def entropy_keep(batch: RolloutBatch, entropies: torch.Tensor, q: float) -> torch.Tensor:
    """In failed rows keep the ceil(q * T_i) highest-entropy policy tokens (ties: earlier)."""
    keep = batch.action_mask.clone()
    for i in range(batch.batch_size):
        if not bool(batch.failures[i]):
            continue
        positions = batch.action_mask[i].nonzero().flatten().tolist()
        ranked = sorted(positions, key=lambda t: (-float(entropies[i, t]), t))
        budget = math.ceil(q * len(positions))
        keep[i] = False
        keep[i, ranked[:budget]] = True
    return keep


def _trajectory(gen: torch.Generator, width: int, prompt_id: int, version: int) -> Trajectory:
    """Prompt, one or two policy turns (with an observation between), all random ids."""

    def draw(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    segments = [(draw(2, 4), False), (draw(2, 6), True)]
    if draw(0, 1):
        segments += [(draw(1, 3), False), (draw(1, 4), True)]
    ids, mask, versions = [], [], []
    for turn, (length, is_action) in enumerate(segments):
        ids += torch.randint(0, VOCAB, (length,), generator=gen).tolist()
        mask += [is_action] * length
        versions += [version + turn // 2 if is_action else -1] * length
    n = min(len(ids), width)
    return Trajectory(
        token_ids=ids[:n],
        action_mask=mask[:n],
        behavior_log_probs=[0.0] * n,
        token_versions=versions[:n],
        reward=float(draw(0, 1)),
        prompt_id=prompt_id,
        failure=bool(draw(0, 1)),
    )


def make_batch(
    policy: torch.nn.Module,
    *,
    rows: int,
    seed: int,
    width: int = 16,
    first_prompt_id: int = 0,
    max_version: int = 3,
    temperature: float = 1.0,
) -> RolloutBatch:
    """A RolloutBatch whose behaviour log-probs are the policy's, perturbed per row."""
    gen = torch.Generator().manual_seed(seed)
    trajectories = [
        _trajectory(
            gen,
            width,
            first_prompt_id + i,
            int(torch.randint(0, max_version + 1, (1,), generator=gen)),
        )
        for i in range(rows)
    ]
    batch = collate(trajectories)
    with torch.no_grad():
        current = naive_logprobs(policy, batch, temperature)
    scales = torch.tensor([NOISE_SCALES[i % len(NOISE_SCALES)] for i in range(rows)])
    noise = torch.randn(current.shape, generator=gen, dtype=torch.float64) * scales[:, None]
    behavior = (current + noise).clamp(max=-1e-3)
    batch.behavior_log_probs = torch.where(batch.action_mask, behavior, 0.0).to(torch.float32)
    return batch


def reference_update(
    policy: torch.nn.Module,
    batch: RolloutBatch,
    *,
    lr: float,
    weight_decay: float,
    betas: Sequence[float],
    eps: float,
    grad_clip: float,
    delta: float,
    temperature: float = 1.0,
    q: float = 1.0,
    **_: Any,
) -> dict[str, torch.Tensor]:
    """One hand-written FlashREINFORCE update: naive log-probs, gate, AdamW, clip.

    `q < 1` keeps only the ceil(q T_i) highest-entropy tokens of failed rows (entropy filter).
    """
    optimizer = torch.optim.AdamW(
        policy.parameters(), lr=lr, weight_decay=weight_decay, betas=tuple(betas), eps=eps
    )
    log_probs, entropies = naive_logprobs_and_entropies(policy, batch, temperature)
    mask = batch.action_mask
    keep = entropy_keep(batch, entropies, q) if q < 1 else mask
    behavior = batch.behavior_log_probs.to(torch.float64)
    advantages = (batch.rewards - batch.rewards.mean()).to(torch.float64)
    current = log_probs.detach()
    rho = torch.exp(torch.where(mask, current - behavior, 0.0))
    p = behavior.exp().clamp(1e-6, 1 - 1e-6)
    q = current.exp().clamp(1e-6, 1 - 1e-6)
    d = p * (p.log() - q.log()) + (1 - p) * ((1 - p).log() - (1 - q).log())
    lengths = mask.sum(dim=1)
    sequence_kl = (torch.where(mask, d, 0.0).sum(dim=1) / lengths).clamp_min(0.0)
    admitted = sequence_kl <= delta
    terms = torch.where(keep & admitted[:, None], rho * advantages[:, None] * log_probs, 0.0)
    loss = -(terms.sum(dim=1) / lengths).sum() / batch.batch_size
    optimizer.zero_grad()
    loss.backward()
    grads = [p.grad for p in policy.parameters() if p.grad is not None]
    total_norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
    coef = min(1.0, grad_clip / (float(total_norm) + 1e-6))
    for g in grads:
        g.mul_(coef)
    optimizer.step()
    retained = (keep & admitted[:, None]).sum()
    return {
        "loss": loss.detach(),
        "grad_norm": total_norm,
        "admitted": admitted,
        "retained_frac": retained / lengths.sum(),
    }


def flat_rewards(batch: RolloutBatch) -> RolloutBatch:
    """`batch` with every reward 1: all advantages 0 under the batch-mean baseline."""
    return dataclasses.replace(batch, rewards=torch.ones_like(batch.rewards))


def rejected(batch: RolloutBatch, rows: slice | None = None) -> RolloutBatch:
    """`batch` with behaviour log-probs moved far below the policy's on `rows` (all rows by
    default), so the sequence Bernoulli-KL gate (delta DELTA) rejects them."""
    chosen = torch.zeros(batch.batch_size, dtype=torch.bool)
    chosen[rows if rows is not None else slice(None)] = True
    behavior = batch.behavior_log_probs
    moved = torch.where(
        batch.action_mask & chosen[:, None], (behavior - 6.0).clamp(max=-1e-3), behavior
    )
    return dataclasses.replace(batch, behavior_log_probs=moved)


class BatchStream(IterableDataset):
    """Yields the given batches in order (one pass)."""

    def __init__(self, batches: Sequence[RolloutBatch]) -> None:
        self.batches = list(batches)

    def __iter__(self) -> Iterator[RolloutBatch]:
        return iter(self.batches)


def loader(batches: Sequence[RolloutBatch]) -> DataLoader:
    return DataLoader(BatchStream(batches), batch_size=None)


class CursorDataModule(L.LightningDataModule):
    """Serves `batches` from a cursor that is checkpointed (consumed batches = global step)."""

    def __init__(self, batches: Sequence[RolloutBatch]) -> None:
        super().__init__()
        self.batches = list(batches)
        self.cursor = 0

    def train_dataloader(self) -> DataLoader:
        return loader(self.batches[self.cursor :])

    def state_dict(self) -> dict[str, int]:
        return {"cursor": int(self.trainer.global_step)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.cursor = int(state["cursor"])


class MemoryLogger(Logger):
    """Keeps every `log_metrics` call in memory."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((int(step or 0), dict(metrics)))


def trainer(max_steps: int, **overrides: Any) -> L.Trainer:
    """A quiet CPU Trainer for tests."""
    kwargs: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "max_steps": max_steps,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
        "log_every_n_steps": 1,
    }
    kwargs.update(overrides)
    return L.Trainer(**kwargs)


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
