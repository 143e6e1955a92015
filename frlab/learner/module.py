"""The FlashREINFORCE learner: one optimizer update per batch of finished trajectories.

SPEC §3 (the one-pass asynchronous update of the FlashREINFORCE paper): take the next B
finished trajectories, centre their rewards over the FULL learner batch, recompute current
log-probs, gate each trajectory, take ONE sample-mean optimizer step, never replay the batch.

Exactness under splitting. The objective's losses are normalised by global quantities
(`num_sequences` = global B, `num_tokens` = global policy-token count), so the losses of
micro-batches and of data-parallel ranks SUM to the full-batch loss. Advantages are computed
once on the global batch (rewards and prompt ids are all-gathered across ranks) and each rank
takes its own rows. DDP averages gradients over W ranks, so each rank back-propagates
`W * loss`; the averaged gradient is then exactly the full-batch gradient. Gradient sync is
blocked on all but the last micro-batch.

No signal, no move. A batch whose global advantages are all 0 (every reward equal under a
batch-mean baseline) has an exactly zero gradient; stepping AdamW anyway moves the policy on
stale moments alone. Its grads are dropped before `optimizer.step()`, so parameters and AdamW
state stay put while the step still counts (version, schedule, global step).

MoE routing replay (`model.routing_replay=true`, frlab.model.routing_replay): each
micro-batch's forward AND backward run with every MoE layer forced to the experts the sampler
recorded (`RolloutBatch.routing`), so the ratio `pi_theta / mu` is not moved by expert flips.

Sharding (frlab.learner.sharding): under `FSDP2Strategy` (a `ModelParallelStrategy`)
`configure_model` shards the policy with FSDP2 and the log-probs run through the sharded root
(`LogprobScorer`). Lightning's `FSDPStrategy` (FSDP1) is refused with a clear error: it runs
`training_step` inside its root forward, where per-micro-batch backwards fail.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import lightning as L
import torch
from torch import Tensor

from frlab.data.batch import RolloutBatch
from frlab.learner import metrics as M
from frlab.learner.checkpoint import capture_rng_states, restore_rng_states
from frlab.learner.metrics import StepMetrics, policy_lag
from frlab.learner.optim import build_optimizer, build_scheduler, grad_clip_norm
from frlab.learner.sharding import LogprobScorer, full_tensor, scorer_for, sequence_logprobs_of
from frlab.model.policy import build_policy
from frlab.model.routing_replay import moe_routers, replay_routing
from frlab.objective import Objective

# `model` keys the learner reads itself; everything else goes to build_policy.
LEARNER_MODEL_KEYS = ("tokenizer", "logprob_chunk_size", "routing_replay")


def to_plain(node: Mapping[str, Any] | None, name: str) -> dict[str, Any]:
    """A plain-dict copy of a config node (OmegaConf resolved); ValueError naming `name`."""
    if node is None:
        return {}
    if type(node).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        node = OmegaConf.to_container(node, resolve=True)  # type: ignore[assignment]
    if not isinstance(node, Mapping):
        raise ValueError(f"{name} must be a mapping, got {type(node).__name__}")
    return {
        k: (to_plain(v, f"{name}.{k}") if isinstance(v, Mapping) else v) for k, v in node.items()
    }


def policy_kwargs(model: Mapping[str, Any]) -> dict[str, Any]:
    """The `model` node minus learner-only keys; unknown keys raise ValueError naming them."""
    accepted = set(inspect.signature(build_policy).parameters)
    kwargs = {k: v for k, v in model.items() if k not in LEARNER_MODEL_KEYS}
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        known = sorted(accepted | set(LEARNER_MODEL_KEYS))
        raise ValueError(
            f"unknown key(s) model.{', model.'.join(unknown)}; known: {', '.join(known)}"
        )
    return kwargs


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class FlashReinforceModule(L.LightningModule):
    """Holds the policy and the composed Objective; manual optimisation, one step per batch."""

    def __init__(
        self,
        model: Mapping[str, Any],
        objective: Mapping[str, Any],
        optim: Mapping[str, Any],
        *,
        batch_size: int,
        micro_batch_size: int,
        temperature: float = 1.0,
        max_steps: int | None = None,
        policy: Any | None = None,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        model_cfg, objective_cfg = to_plain(model, "model"), to_plain(objective, "objective")
        optim_cfg = to_plain(optim, "optim")
        self.batch_size = _positive_int("data.batch_size", batch_size)
        self.micro_batch_size = _positive_int("data.micro_batch_size", micro_batch_size)
        if max_steps is not None:
            max_steps = _positive_int("max_steps", max_steps)
        self.max_steps = max_steps
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
            raise ValueError(f"temperature must be a number, got {temperature!r}")
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be finite and > 0, got {temperature!r}")
        self.temperature = float(temperature)
        self.logprob_chunk_size = _positive_int(
            "model.logprob_chunk_size", model_cfg.get("logprob_chunk_size", 1024)
        )
        self.routing_replay = model_cfg.get("routing_replay", False)
        if not isinstance(self.routing_replay, bool):
            raise ValueError(f"model.routing_replay must be a bool, got {self.routing_replay!r}")
        self.grad_clip = grad_clip_norm(optim_cfg.get("grad_clip"))
        self.optim_cfg = optim_cfg
        build_kwargs = policy_kwargs(model_cfg)
        self.save_hyperparameters(
            {
                "model": model_cfg,
                "objective": objective_cfg,
                "optim": optim_cfg,
                "batch_size": self.batch_size,
                "micro_batch_size": self.micro_batch_size,
                "temperature": self.temperature,
                "max_steps": max_steps,
            }
        )
        self.policy = policy if policy is not None else build_policy(**build_kwargs)
        if self.routing_replay:
            try:
                moe_routers(self.policy)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"model.routing_replay=true needs an MoE policy: {exc}") from exc
        self.objective = Objective.from_config(objective_cfg)
        self.policy_version = 0
        self.step_metrics = StepMetrics()
        self._scorer: LogprobScorer | None = None  # FSDP2 root; set by configure_model

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_scorer":  # not a registered child: the policy's parameters appear once
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    # ----------------------------------------------------------------- Lightning wiring
    def configure_model(self) -> None:
        """Shard the policy under FSDP2Strategy; refuse FSDP1 (frlab.learner.sharding)."""
        if self._scorer is None:
            self._scorer = scorer_for(getattr(self._trainer, "strategy", None), self.policy)

    def configure_optimizers(self) -> dict[str, Any]:
        params = [p for p in self._trained_module().parameters() if p.requires_grad]
        optimizer = build_optimizer(params, **self.optim_cfg)
        scheduler = build_scheduler(
            optimizer,
            scheduler=self.optim_cfg.get("scheduler", "constant"),
            max_steps=self._horizon(),
            warmup_ratio=self.optim_cfg.get("warmup_ratio", 0.0),
            min_lr_ratio=self.optim_cfg.get("min_lr_ratio", 0.0),
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def _trained_module(self) -> torch.nn.Module:
        """The (possibly strategy-wrapped) module whose parameters the optimizer updates."""
        trainer = self._trainer
        return trainer.model if trainer is not None and trainer.model is not None else self

    def _horizon(self) -> int | None:
        """The lr schedule's length: `optim.schedule_steps`, else `max_steps`, else the
        trainer's `max_steps` (frlab.learner.optim)."""
        schedule_steps = self.optim_cfg.get("schedule_steps")
        if schedule_steps is not None:
            return _positive_int("optim.schedule_steps", schedule_steps)
        if self.max_steps is not None:
            return self.max_steps
        trainer = self._trainer
        steps = getattr(trainer, "max_steps", -1) if trainer is not None else -1
        return steps if isinstance(steps, int) and steps > 0 else None

    def on_fit_start(self) -> None:
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        if scaler is not None:
            raise ValueError(
                "trainer.precision=16-mixed (loss scaling) is not supported by the learner; "
                "use bf16-mixed or 32-true"
            )
        world = self.trainer.world_size
        if self.batch_size % world:
            raise ValueError(
                f"data.batch_size={self.batch_size} is not divisible by the world size {world}"
            )

    def transfer_batch_to_device(
        self, batch: Any, device: torch.device, dataloader_idx: int
    ) -> Any:
        if isinstance(batch, RolloutBatch):
            return batch.to(device)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["policy_version"] = int(self.policy_version)
        checkpoint["rng_states"] = capture_rng_states()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        for key in ("policy_version", "rng_states"):
            if key not in checkpoint:
                raise ValueError(f"checkpoint lacks {key!r}: not written by FlashReinforceModule")
        self.policy_version = int(checkpoint["policy_version"])
        restore_rng_states(checkpoint["rng_states"])

    # ----------------------------------------------------------------- distributed helpers
    def _world(self) -> tuple[int, int]:
        trainer = self._trainer
        if trainer is None:
            return 1, 0
        return trainer.world_size, trainer.global_rank

    def _gather_rows(self, x: Tensor) -> Tensor:
        """Rank-major concatenation of every rank's `x` [b] -> [W*b] (identity for W=1)."""
        world, _ = self._world()
        if world == 1:
            return x
        return self.all_gather(x).reshape(-1)

    def _sum_across_ranks(self, x: Tensor) -> Tensor:
        world, _ = self._world()
        if world == 1:
            return x
        return self.trainer.strategy.reduce(x.clone(), reduce_op="sum")

    @contextmanager
    def _grad_sync(self, enabled: bool) -> Iterator[None]:
        """Block DDP gradient all-reduce unless `enabled` (the last micro-batch)."""
        strategy = getattr(self._trainer, "strategy", None)
        if self._scorer is not None:  # FSDP2: skip the reduce-scatter until the last one
            self._scorer.set_requires_gradient_sync(enabled)  # type: ignore[operator]
            yield
            return
        block = getattr(strategy, "block_backward_sync", None)
        with nullcontext() if enabled or block is None else block():
            yield

    def _clip_gradients(self) -> Tensor:
        """Pre-clip total gradient norm; clips to optim.grad_clip (inf: measure only)."""
        params = [p for p in self.parameters() if p.grad is not None]
        # FSDP2: sharded (DTensor) gradients; the norm is global, its value gathered here.
        norm = full_tensor(torch.nn.utils.clip_grad_norm_(params, self.grad_clip))
        if not bool(torch.isfinite(norm)):
            raise FloatingPointError(
                f"non-finite gradient norm {float(norm)} at policy_version {self.policy_version}"
            )
        return norm.detach()

    # ----------------------------------------------------------------- the update
    def _check_batch(self, batch: Any, world: int) -> None:
        if not isinstance(batch, RolloutBatch):
            raise TypeError(f"training batch must be a RolloutBatch, got {type(batch).__name__}")
        local = self.batch_size // world
        if batch.batch_size != local:
            raise ValueError(
                f"RolloutBatch has {batch.batch_size} rows on this rank; data.batch_size="
                f"{self.batch_size} over {world} rank(s) expects {local}"
            )
        if self.routing_replay and batch.routing is None:
            raise ValueError(
                "model.routing_replay=true but the RolloutBatch has no routing: the rollout "
                "engine must record it (TorchEngine(record_routing=True))"
            )

    def _replay(self, mb: RolloutBatch) -> AbstractContextManager[None]:
        """Force the recorded experts of `mb` when routing replay is on (else a no-op)."""
        if not self.routing_replay:
            return nullcontext()
        if mb.routing is None:
            raise ValueError("model.routing_replay=true but a micro-batch has no routing")
        return replay_routing(self.policy, mb.routing)

    def _micro_step(
        self,
        mb: RolloutBatch,
        advantages: Tensor,
        *,
        num_sequences: int,
        num_tokens: int,
        scale: float,
        timings: dict[str, float],
    ) -> Tensor:
        """Forward, objective and backward of one micro-batch; returns its detached loss.

        With routing replay the recorded experts stay forced through the backward too
        (gradient checkpointing recomputes the forward there).
        """
        mb = mb.trim()
        with self._replay(mb):
            t0 = time.perf_counter()
            score = self._scorer if self._scorer is not None else sequence_logprobs_of(self.policy)
            log_probs, entropies = score(
                mb.input_ids,
                mb.attention_mask,
                mb.position_ids,
                temperature=self.temperature,
                chunk_size=self.logprob_chunk_size,
                compute_entropy=bool(self.objective.needs_entropies),
                action_mask=mb.action_mask,
            )
            _sync_device(log_probs.device)
            timings["logprob"] += time.perf_counter() - t0
            behavior = mb.behavior_log_probs.to(
                torch.promote_types(log_probs.dtype, mb.behavior_log_probs.dtype)
            )
            loss, diagnostics = self.objective(
                log_probs,
                behavior,
                advantages,
                mb.action_mask,
                entropies=entropies,
                failures=mb.failures,
                num_sequences=num_sequences,
                num_tokens=num_tokens,
            )
            self.step_metrics.update_diagnostics(diagnostics)
            t0 = time.perf_counter()
            self.manual_backward(loss * scale)
            _sync_device(log_probs.device)
            timings["backward"] += time.perf_counter() - t0
            return loss.detach()

    def training_step(self, batch: RolloutBatch, batch_idx: int) -> None:
        step_start = time.perf_counter()
        world, rank = self._world()
        self._check_batch(batch, world)
        local_b = batch.batch_size
        global_rewards = self._gather_rows(batch.rewards)
        global_groups = self._gather_rows(batch.prompt_ids)
        global_advantages = self.objective.advantages(global_rewards, global_groups)
        no_signal = bool((global_advantages == 0).all())  # same on every rank
        advantages = global_advantages[rank * local_b : (rank + 1) * local_b]
        num_tokens = int(self._sum_across_ranks(batch.action_mask.sum()).item())
        lag = policy_lag(self.policy_version, batch.token_versions, batch.action_mask)
        self.step_metrics.update_rows(
            rewards=batch.rewards, lag=lag, response_tokens=batch.action_mask.sum(dim=1)
        )
        self.step_metrics.update_episodes(batch.infos)

        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        lr = float(optimizer.optimizer.param_groups[0]["lr"])
        optimizer.zero_grad(set_to_none=True)
        timings = {"logprob": 0.0, "backward": 0.0}
        micro_batches = batch.split(self.micro_batch_size)
        loss = torch.zeros((), dtype=torch.float64, device=batch.rewards.device)
        for k, mb in enumerate(micro_batches):
            rows = slice(k * self.micro_batch_size, k * self.micro_batch_size + mb.batch_size)
            with self._grad_sync(enabled=k == len(micro_batches) - 1):
                loss = loss + self._micro_step(
                    mb,
                    advantages[rows],
                    num_sequences=self.batch_size,
                    num_tokens=num_tokens,
                    scale=float(world),
                    timings=timings,
                ).to(loss.dtype)
        grad_norm = self._clip_gradients()
        if no_signal:
            # Every advantage is 0, so the gradient is exactly 0; AdamW would still move the
            # policy on its moments alone (measured on the toy: as far as a real update). Drop
            # the grads: the optimizer then leaves parameters and moments as they are, and the
            # step still counts (version, schedule, Lightning's global_step).
            optimizer.zero_grad(set_to_none=True)
        optimizer.step()
        scheduler.step()
        self.policy_version += 1
        self._log_step(
            loss=self._sum_across_ranks(loss),
            grad_norm=grad_norm,
            lr=lr,
            timings={**timings, "step": time.perf_counter() - step_start},
        )

    def _log_step(
        self, *, loss: Tensor, grad_norm: Tensor, lr: float, timings: dict[str, float]
    ) -> None:
        values = self.step_metrics.compute()
        self.step_metrics.reset()
        values.update(
            {
                M.LOSS: float(loss),
                M.GRAD_NORM: float(grad_norm),
                M.LR: lr,
                M.STEP_S: timings["step"],
                M.LOGPROB_S: timings["logprob"],
                M.BACKWARD_S: timings["backward"],
            }
        )
        for name, value in values.items():
            self.log(
                name,
                value,
                on_step=True,
                on_epoch=False,
                prog_bar=name in M.PROGRESS_BAR,
                batch_size=self.batch_size,
            )
