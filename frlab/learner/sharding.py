"""Fully sharded learner (FSDP2, `torch.distributed.fsdp.fully_shard`) for 7B+ policies.

Why not Lightning's `FSDPStrategy` (FSDP1): it wraps the whole LightningModule, so
`training_step` runs INSIDE the FSDP root forward. The learner back-propagates each
micro-batch there (several `manual_backward`s per step) and reads `lm_head.weight` directly
for the chunked head; FSDP1's state machine refuses both (`no_sync` raises "expected to be in
states [IDLE] but current state is FORWARD_BACKWARD", a backward inside the forward raises
"Expects BACKWARD_PRE or BACKWARD_POST state but got FORWARD"; checked with torch 2.13,
lightning 2.6.6, on CPU through gloo: the same code paths run on GPUs).

FSDP2 instead shards the modules in place (`configure_model`, Lightning's
`ModelParallelStrategy`) and leaves `training_step` alone. Every decoder layer (the model's
`_no_split_modules` classes: `Qwen2DecoderLayer`, `Qwen3MoeDecoderLayer`, ...) is one FSDP
unit; the remaining parameters (embeddings, final norm, LM head) belong to a root unit whose
forward is `LogprobScorer.forward`, i.e. the whole log-prob computation including the chunked
head. So each micro-batch is a proper FSDP forward + backward: parameters are gathered before
use, gradients reduce-scattered after. `set_requires_gradient_sync(False)` skips the
reduce-scatter on all but the last micro-batch.

Checkpoints (`save_distributed_checkpoint=True`): each rank writes its shards into a fresh
hidden folder next to the target; then rank 0 repoints the target name (`last.ckpt`, a
symlink) at it with one `os.replace` and deletes the previous folder. Lightning's own sharded
save rewrites `last.ckpt/` in place (no CheckpointIO, so `AtomicCheckpointIO` never sees it): a
crash mid-save would corrupt the only checkpoint. `ckpt_path=last` and explicit paths resume
through the symlink.
"""

from __future__ import annotations

import functools
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from lightning.pytorch.strategies import ModelParallelStrategy
from torch import Tensor, nn

from frlab.errors import ConfigError
from frlab.fsio import fsync_path
from frlab.model.lm_logprobs import sequence_logprobs


class LogprobScorer(nn.Module):
    """Root FSDP unit: `forward` = `sequence_logprobs(policy, ...)` (chunked LM head included)."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
        return sequence_logprobs(self.policy, *args, **kwargs)


def layer_classes(policy: nn.Module) -> tuple[str, ...]:
    """Class names of the policy's transformer blocks (HF `_no_split_modules`)."""
    names = tuple(getattr(policy, "_no_split_modules", None) or ())
    if not names:
        raise ValueError(
            f"{type(policy).__name__} declares no `_no_split_modules`: cannot tell which modules "
            "are its decoder layers for trainer.strategy (FSDP2)"
        )
    return names


def shard_policy(policy: nn.Module, mesh: Any) -> LogprobScorer:
    """Shard every decoder layer, then the rest under a `LogprobScorer` root; returns the root.

    The policy's parameters are replaced in place by sharded DTensors (build the optimizer
    afterwards). `mesh` is a 1-D device mesh over the data-parallel ranks.
    """
    from torch.distributed.fsdp import fully_shard

    names = layer_classes(policy)
    layers = [m for m in policy.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"no module of class {', '.join(names)} found in the policy")
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    scorer = LogprobScorer(policy)
    fully_shard(scorer, mesh=mesh)
    return scorer


def full_tensor(x: Tensor) -> Tensor:
    """A DTensor's full value (a collective: every rank must call it); plain tensors as is."""
    gather = getattr(x, "full_tensor", None)
    return gather() if callable(gather) else x


def full_state_dict(module: nn.Module) -> dict[str, Tensor]:
    """`module.state_dict()` with sharded tensors gathered one at a time into CPU memory
    (a collective: every rank must call it); an unsharded module's own tensors as they are."""
    out = {}
    for name, value in module.state_dict().items():
        sharded = callable(getattr(value, "full_tensor", None))
        out[name] = full_tensor(value).cpu() if sharded else value
    return out


class FSDP2Strategy(ModelParallelStrategy):
    """`ModelParallelStrategy` as pure data-parallel FSDP2: one mesh over all ranks, no TP.

    `tensor_parallel_size` is fixed to 1 (the learner implements no tensor parallelism), and
    the data-parallel size defaults to every rank (`devices x num_nodes`).
    """

    def __init__(self, save_distributed_checkpoint: bool = True, **kwargs: Any) -> None:
        for key in ("data_parallel_size", "tensor_parallel_size"):
            if key in kwargs:
                raise ConfigError(
                    f"trainer.strategy.{key}",
                    "is fixed by FSDP2Strategy (all ranks data-parallel, "
                    "no tensor parallelism); remove it",
                )
        super().__init__(
            data_parallel_size="auto",
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            **kwargs,
        )

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        """Sharded: write a fresh hidden folder, then atomically repoint `filepath` (a symlink)
        at it (`publish_checkpoint`); a crash mid-save leaves the previous checkpoint whole."""
        if not self._save_distributed_checkpoint:  # one file, through AtomicCheckpointIO
            super().save_checkpoint(checkpoint, filepath, storage_options)
            return
        link = Path(self.broadcast(str(filepath)))
        fresh = link.with_name(self.broadcast(f".{link.name}.{uuid.uuid4().hex[:12]}"))
        super().save_checkpoint(checkpoint, fresh, storage_options)
        self.barrier("frlab_sharded_checkpoint_written")
        if self.global_rank == 0:
            publish_checkpoint(fresh, link)
        self.barrier("frlab_sharded_checkpoint_published")

    def remove_checkpoint(self, filepath: Any) -> None:
        """Remove a published checkpoint: the symlink and the folder it points to."""
        path = Path(filepath)
        if self.global_rank == 0 and path.is_symlink():
            target = path.resolve()
            path.unlink()
            shutil.rmtree(target, ignore_errors=True)
            return
        super().remove_checkpoint(filepath)


def _fsync_tree(folder: Path) -> None:
    """fsync every file of `folder` and the folder itself (best effort where unsupported)."""
    for item in [*folder.iterdir(), folder]:
        fsync_path(item)


def publish_checkpoint(fresh: Path, link: Path) -> None:
    """Point the symlink `link` at the complete folder `fresh` in one `os.replace`, then delete
    the folder it pointed to before. A real folder at `link` (a sharded checkpoint written
    without this strategy) is first moved aside to a hidden sibling, then deleted likewise."""
    if not fresh.is_dir():
        raise FileNotFoundError(f"sharded checkpoint folder {fresh} does not exist")
    _fsync_tree(fresh)
    old: Path | None = None
    if link.is_symlink():
        old = link.resolve()
    elif link.is_dir():
        old = link.with_name(f".{link.name}.replaced-{uuid.uuid4().hex[:12]}")
        os.replace(link, old)
    tmp = link.with_name(f".{link.name}.link-{uuid.uuid4().hex[:12]}")
    os.symlink(fresh.name, tmp)  # relative: the run folder may move
    try:
        os.replace(tmp, link)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_tree(link.parent)
    if old is not None and old != fresh.resolve():
        shutil.rmtree(old, ignore_errors=True)


def data_parallel_mesh(strategy: ModelParallelStrategy) -> Any:
    """The 1-D data-parallel mesh of `strategy`; ValueError when tensor parallelism is on."""
    mesh = strategy.device_mesh
    tp = mesh["tensor_parallel"].size()
    if tp != 1:
        raise ConfigError(
            "trainer.strategy.tensor_parallel_size",
            f"trainer.strategy.tensor_parallel_size={tp}: the learner is data-parallel only "
            "(FSDP2); use frlab.learner.sharding.FSDP2Strategy",
        )
    return mesh["data_parallel"]


def scorer_for(strategy: Any, policy: nn.Module) -> LogprobScorer | None:
    """The FSDP2 root for `strategy` (None when unsharded); ValueError for FSDP1."""
    from lightning.pytorch.strategies import FSDPStrategy

    if isinstance(strategy, FSDPStrategy):
        raise ConfigError(
            "trainer.strategy",
            "Lightning's FSDPStrategy (FSDP1) cannot run this learner "
            "(training_step runs inside the FSDP root forward, where its per-micro-batch "
            "backwards fail); use trainer=fsdp_7b or trainer=fsdp_30b_a3b "
            "(frlab.learner.sharding.FSDP2Strategy)",
        )
    if isinstance(strategy, ModelParallelStrategy):
        return shard_policy(policy, data_parallel_mesh(strategy))
    return None


def sequence_logprobs_of(policy: nn.Module) -> Any:
    """The unsharded scorer: `sequence_logprobs` bound to `policy`."""
    return functools.partial(sequence_logprobs, policy)
