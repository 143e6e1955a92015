"""Limits a process engine meets when it shares the policy's weights with its child process
(frlab.rollout.torch.process): room in /dev/shm, and one open file per shared storage."""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def check_shared_memory(model: PreTrainedModel, shm: str = "/dev/shm") -> None:
    """ValueError when `shm` (where torch puts shared CPU tensors on Linux) has less free space
    than the weights need: containers often default to 64 MiB, and a full /dev/shm kills the
    process with a bus error instead of an exception."""
    if not os.path.isdir(shm):
        return
    need = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    free = shutil.disk_usage(shm).free
    if need > free:
        raise ValueError(
            f"rollout/engine=torch_process needs {need / 2**20:.0f} MiB of shared memory for the "
            f"weights, {shm} has {free / 2**20:.0f} MiB free (raise the container's shared "
            "memory, e.g. docker --shm-size, or use rollout/engine=torch)"
        )


FD_MARGIN = 512  # open files the learner needs besides the shared weights (logs, sockets, data)


def check_open_files(model: PreTrainedModel) -> None:
    """Torch keeps one open file per shared CPU storage, in this process and in the child (which
    inherits the limit): raise the soft open-files limit when it is too low for the weights plus
    FD_MARGIN, up to the hard limit; ValueError when even that is too low."""
    import resource

    storages = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    need = len(storages) + FD_MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or need <= soft:
        return
    if hard != resource.RLIM_INFINITY and need > hard:
        raise ValueError(
            f"rollout/engine=torch_process shares {len(storages)} weight tensors, one open file "
            f"each, but the open-files hard limit is {hard} (raise it: ulimit -Hn, or use "
            "rollout/engine=torch)"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
