"""The FlashREINFORCE learner: one optimizer update per batch of finished trajectories.

The one-pass asynchronous update of the FlashREINFORCE paper: take the next B
finished trajectories, centre their rewards over the FULL learner batch, recompute current
log-probs, gate each trajectory, take ONE sample-mean optimizer step, never replay the batch.

Exactness under splitting. The objective's losses are normalised by global quantities
(`num_sequences` = global B, `num_tokens` = global policy-token count), so the losses of
micro-batches and of data-parallel ranks SUM to the full-batch loss, whatever rows share a
micro-batch. Advantages are computed once on the global batch (rewards and prompt ids are
all-gathered across ranks) and each rank takes its own rows. DDP averages gradients over W
ranks, so each rank back-propagates `W * loss`; the averaged gradient is then exactly the
full-batch gradient. Gradient sync is blocked on all but the last micro-batch.

Micro-batches (frlab.learner.micro_batches): at most
`data.micro_batch_size` rows and, when set, `data.max_tokens_per_micro_batch` tokens each;
with `data.pack_sequences` each runs as one padding-free row whose trajectories never attend
to each other (frlab.model.packed_attention). With a token budget, data-parallel ranks first
agree on one micro-batch count (FSDP2 needs every rank in every forward).

Zero-signal steps (`optim.skip_zero_signal_steps`, off by default as in the reference, which
steps AdamW on every batch). A batch whose gradient is exactly 0 (all advantages 0, every
trajectory rejected, every token filtered) still moves AdamW's weights through weight decay
and the moments. With the option on, such a step leaves parameters and AdamW state as they
are (the step still counts: version, schedule, global step); a batch whose advantages are
all 0 skips its forward and backward, and a micro-batch none of whose rows can contribute
skips its backward. Every step logs `train/zero_signal_step` (1 when its gradient was 0).

MoE routing replay (`model.routing_replay=true`, frlab.model.routing_replay): each
micro-batch's forward AND backward run with every MoE layer forced to the experts the sampler
recorded (`RolloutBatch.routing`), so the ratio `pi_theta / mu` is not moved by expert flips.

`configure_model` shards the policy under `FSDP2Strategy` (frlab.learner.sharding; log-probs
run through the sharded root; Lightning's FSDP1 is refused) and compiles its decoder layers
for `model.compile=true` (frlab.model.compile: packed rows bucketed, `train/compiles`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
import torch
from torch import Tensor

from frlab.data.batch import RolloutBatch, per_rank_batch
from frlab.errors import ConfigError
from frlab.learner.checkpoint import capture_rng_states, restore_rng_states
from frlab.learner.distributed import (
    clip_gradients,
    gather_rows,
    grad_sync,
    reduce_across_ranks,
    world_of,
)
from frlab.learner.metrics import COMPILES, PROGRESS_BAR, StepMetrics
from frlab.learner.micro_batches import (
    MicroBatching,
    agreed_count,
    contributes,
    forward_context,
    split_batch,
)
from frlab.learner.optim import build_scheduler, make_optimizer
from frlab.learner.settings import LearnerSettings, check_policy
from frlab.learner.sharding import LogprobScorer, scorer_for, sequence_logprobs_of
from frlab.learner.step_log import StepLog
from frlab.model.compile import BUCKET, CompileCounter, compile_layers
from frlab.objective import Objective
from frlab.ops.phases import phase


def _sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class FlashReinforceModule(L.LightningModule):
    """Holds the policy and the composed Objective; manual optimisation, one step per batch.

    Built from objects: the `policy` (an `nn.Module` whose forward gives logits), the run's
    `objective` (frlab.objective.Objective), an `optimizer` factory (`params -> Optimizer`,
    e.g. the `optim` node's partial of torch's AdamW) and `settings` (LearnerSettings: the
    config keys the learner reads, checked by preflight). `record`: what the checkpoint keeps
    of the run's config (`model`: `python -m frlab.export` rebuilds the architecture from it).
    """

    def __init__(
        self,
        policy: torch.nn.Module,
        objective: Objective,
        optimizer: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
        settings: LearnerSettings,
        *,
        record: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.settings = settings
        self.micro = MicroBatching(
            settings.micro_batch_size, settings.max_tokens_per_micro_batch, settings.pack_sequences
        )
        self.save_hyperparameters(
            {**dict(record or {}), "learner": dataclasses.asdict(settings)}, logger=False
        )
        self.policy = policy
        check_policy(self.policy, settings)
        self.objective = objective
        self.optimizer_factory = optimizer
        self.policy_version = 0
        self.step_metrics = StepMetrics(self.objective)
        self.step_log = StepLog()  # `self.log`'s destinations without its per-call cost
        self._scorer: LogprobScorer | None = None  # FSDP2 root; set by configure_model
        self.compiled: CompileCounter | None = None  # model.compile: set by configure_model
        self.compile_backend = "inductor"

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
        if self.settings.compile and self.compiled is None:
            self.compiled = compile_layers(self.policy, self.compile_backend)

    def configure_optimizers(self) -> dict[str, Any]:
        params = [p for p in self._trained_module().parameters() if p.requires_grad]
        optimizer = make_optimizer(self.optimizer_factory, params)
        scheduler = build_scheduler(
            optimizer,
            scheduler=self.settings.scheduler,
            max_steps=self.settings.schedule_length,
            warmup_ratio=self.settings.warmup_ratio,
            min_lr_ratio=self.settings.min_lr_ratio,
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def _trained_module(self) -> torch.nn.Module:
        """The (possibly strategy-wrapped) module whose parameters the optimizer updates."""
        trainer = self._trainer
        return trainer.model if trainer is not None and trainer.model is not None else self

    def on_fit_start(self) -> None:
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        if scaler is not None:
            raise ConfigError(
                "trainer.precision",
                "trainer.precision=16-mixed (loss scaling) is not supported by the learner; "
                "use bf16-mixed or 32-true",
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

    # ----------------------------------------------------------------- the update
    def _check_batch(self, batch: Any, world: int) -> None:
        if not isinstance(batch, RolloutBatch):
            raise TypeError(f"training batch must be a RolloutBatch, got {type(batch).__name__}")
        local = per_rank_batch(self.settings.batch_size, world)
        if batch.batch_size != local:
            raise ValueError(
                f"RolloutBatch has {batch.batch_size} rows on this rank; data.batch_size="
                f"{self.settings.batch_size} over {world} rank(s) expects {local}"
            )
        if self.settings.routing_replay and batch.routing is None:
            raise ConfigError(
                "model.routing_replay",
                "model.routing_replay=true but the RolloutBatch has no routing: the rollout "
                "engine must record it (TorchEngine(record_routing=True))",
            )

    def _forward(
        self,
        mb: RolloutBatch,
        advantages: Tensor,
        *,
        num_tokens: int,
        timings: dict[str, float],
    ) -> tuple[Tensor, Tensor]:
        """Log-probs and objective of one micro-batch: (loss, whether any row contributes)."""
        t0 = time.perf_counter()
        score = self._scorer if self._scorer is not None else sequence_logprobs_of(self.policy)
        log_probs, entropies = score(
            mb.input_ids,
            mb.attention_mask,
            mb.position_ids,
            temperature=self.settings.temperature,
            chunk_size=self.settings.logprob_chunk_size,
            compute_entropy=bool(self.objective.needs_entropies),
            action_mask=mb.action_mask,
            pack=self.micro.pack,
            bucket=BUCKET if self.compiled is not None else None,
        )
        _sync_device(log_probs.device)
        timings["logprob"] += time.perf_counter() - t0
        behavior = mb.behavior_log_probs.to(
            torch.promote_types(log_probs.dtype, mb.behavior_log_probs.dtype)
        )
        with phase("objective"):
            loss, diagnostics = self.objective(
                log_probs,
                behavior,
                advantages,
                mb.action_mask,
                entropies=entropies,
                failures=mb.failures,
                num_sequences=self.settings.batch_size,
                num_tokens=num_tokens,
            )
        self.step_metrics.update_diagnostics(diagnostics)
        return loss, contributes(diagnostics).any()

    def _backward(self, loss: Tensor, timings: dict[str, float]) -> None:
        t0 = time.perf_counter()
        with phase("backward"):
            self.manual_backward(loss)
        _sync_device(loss.device)
        timings["backward"] += time.perf_counter() - t0

    def _accumulate(
        self, batch: RolloutBatch, advantages: Tensor, num_tokens: int, timings: dict[str, float]
    ) -> tuple[Tensor, int]:
        """Forward and backward of every micro-batch: (the rank's detached loss, micro-batches).

        With `optim.skip_zero_signal_steps`, a micro-batch none of whose rows contributes on
        any rank skips its backward (its gradient is exactly 0). The last micro-batch carries
        the data-parallel gradient sync, so it runs whenever an earlier backward ran.
        """
        world, _ = world_of(self)
        parts = split_batch(batch, self.micro, agreed_count(self, batch, self.micro))
        loss = torch.zeros((), dtype=torch.float64, device=batch.rewards.device)
        ran_backward = False
        for k, (rows, mb) in enumerate(parts):
            last = k == len(parts) - 1
            with (
                grad_sync(self, self._scorer, enabled=last),
                forward_context(
                    self.policy,
                    mb,
                    pack=self.micro.pack,
                    routing_replay=self.settings.routing_replay,
                ),
            ):
                mb_loss, live = self._forward(
                    mb, advantages[rows], num_tokens=num_tokens, timings=timings
                )
                loss = loss + mb_loss.detach().to(loss.dtype)
                if self.settings.skip_zero_signal_steps:
                    live = bool(reduce_across_ranks(self, live.long(), "max").item())
                    if not live and not (last and ran_backward and world > 1):
                        continue
                self._backward(mb_loss * float(world), timings)
                ran_backward = True
        return loss, len(parts)

    def training_step(self, batch: RolloutBatch, batch_idx: int) -> None:
        step_start = time.perf_counter()
        world, rank = world_of(self)
        self._check_batch(batch, world)
        local_b = batch.batch_size
        global_advantages = self.objective.advantages(
            gather_rows(self, batch.rewards), gather_rows(self, batch.prompt_ids)
        )
        all_zero = bool((global_advantages == 0).all())  # same on every rank
        advantages = global_advantages[rank * local_b : (rank + 1) * local_b]
        num_tokens = int(reduce_across_ranks(self, batch.action_mask.sum(), "sum").item())
        self.step_metrics.update_batch(batch, self.policy_version)

        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        lr = float(optimizer.optimizer.param_groups[0]["lr"])
        optimizer.zero_grad(set_to_none=True)
        timings = {"logprob": 0.0, "backward": 0.0}
        if self.settings.skip_zero_signal_steps and all_zero:  # the gradient is 0: skip the work
            loss = torch.zeros((), dtype=torch.float64, device=batch.rewards.device)
            micro_batches = 0
        else:
            loss, micro_batches = self._accumulate(batch, advantages, num_tokens, timings)
        with phase("optimizer"):
            grad_norm = clip_gradients(
                self.parameters(), self.settings.clip_norm, self.policy_version
            )
            zero_signal = bool(grad_norm == 0)  # global: every gradient entry is exactly 0
            if zero_signal and self.settings.skip_zero_signal_steps:
                # Without grads AdamW leaves parameters and moments as they are; the step counts.
                optimizer.zero_grad(set_to_none=True)
            optimizer.step()
            scheduler.step()
        self.policy_version += 1
        self._log_step(
            loss=reduce_across_ranks(self, loss, "sum"),
            grad_norm=grad_norm,
            lr=lr,
            zero_signal=zero_signal,
            micro_batches=micro_batches,
            timings={**timings, "step": time.perf_counter() - step_start},
        )

    def _log_step(
        self,
        *,
        loss: Tensor,
        grad_norm: Tensor,
        lr: float,
        zero_signal: bool,
        micro_batches: int,
        timings: dict[str, float],
    ) -> None:
        values = self.step_metrics.finish(
            loss=loss,
            grad_norm=grad_norm,
            lr=lr,
            timings=timings,
            zero_signal=zero_signal,
            micro_batches=micro_batches,
        )
        if self.compiled is not None:
            values[COMPILES] = float(self.compiled.compiles)
        self.step_log.add(self._trainer, values, PROGRESS_BAR)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """The step's metrics (this module's and callbacks') to the loggers, after every
        callback's `on_train_batch_end`, where Lightning logs on-step values (a subclass that
        overrides this hook calls `super().on_train_batch_end(...)`)."""
        self.step_log.flush(self._trainer)
