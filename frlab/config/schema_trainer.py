"""The `trainer` node: every `lightning.Trainer` argument a config may set, declared once.

Defaults are Lightning's own (tests/config checks them against the installed Lightning), except
the ones frlab needs for an endless rollout stream (`max_steps`, an integer
`val_check_interval`, `check_val_every_n_epoch: null`, no validation batches) and its CPU
default. Arguments frlab sets itself, or that contradict manual optimisation, are not
declared: setting one is refused with the reason (`REFUSED`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from frlab.config.declare import spec
from frlab.config.errors import ConfigError

PRECISIONS = (
    "32-true", "32", "64-true", "64", "bf16-mixed", "bf16-true", "16-mixed", "16-true",
    "transformer-engine",
)  # fmt: skip
ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "tpu", "auto")


@dataclass
class TrainerConfig:
    """`lightning.Trainer` keyword arguments (Lightning 2.6)."""

    REFUSED: ClassVar[dict[str, str]] = {
        "logger": "choose a logger with the `logger` group (logger=csv|tensorboard|wandb)",
        "callbacks": "add callbacks under the `callbacks` group",
        "plugins": "frlab installs AtomicCheckpointIO itself",
        "accumulate_grad_batches": "one optimizer step per learner batch; use "
        "data.micro_batch_size",
        "gradient_clip_val": "manual optimisation clips in the learner; use optim.grad_clip",
        "gradient_clip_algorithm": "manual optimisation clips in the learner; use optim.grad_clip",
        "max_epochs": "the rollout stream is endless; use trainer.max_steps",
        "default_root_dir": "it is the run folder (paths.output_dir, hydra.run.dir)",
    }

    _target_: str = "lightning.Trainer"
    max_steps: int = spec(60, low=1, doc="optimizer updates")
    accelerator: str = spec("cpu", choices=ACCELERATORS)
    devices: Any = spec(1, doc="an int, a list of ids or auto; ranks = devices x num_nodes")
    num_nodes: int = spec(1, low=1)
    strategy: Any = spec("auto", doc="auto | ddp | a strategy node (trainer=fsdp: FSDP2Strategy)")
    precision: str = spec("32-true", choices=PRECISIONS, doc="bf16-mixed on GPUs")
    log_every_n_steps: int | None = 1
    val_check_interval: Any = spec(1000000, doc="endless iterable: an integer interval")
    check_val_every_n_epoch: int | None = spec(None, doc="null: no epochs")
    limit_val_batches: Any = 0
    num_sanity_val_steps: int | None = 0
    enable_model_summary: bool | None = False
    deterministic: Any = spec(False, doc="true | false | warn")
    enable_checkpointing: bool | None = spec(
        None, doc="false with callbacks.model_checkpoint: null"
    )
    enable_progress_bar: bool | None = None
    fast_dev_run: Any = False
    min_epochs: int | None = None
    min_steps: int | None = None
    max_time: Any = spec(None, doc="DD:HH:MM:SS or a mapping of days/hours/minutes/seconds")
    limit_train_batches: Any = None
    limit_test_batches: Any = None
    limit_predict_batches: Any = None
    overfit_batches: Any = 0.0
    benchmark: bool | None = None
    inference_mode: bool = True
    use_distributed_sampler: bool = True
    profiler: Any = None
    detect_anomaly: bool = False
    barebones: bool = False
    sync_batchnorm: bool = False
    reload_dataloaders_every_n_epochs: int = 0
    enable_autolog_hparams: bool = True
    model_registry: str | None = None


# The defaults above that are frlab's, not Lightning's.
FRLAB_DEFAULTS = (
    "max_steps", "accelerator", "devices", "precision", "log_every_n_steps", "val_check_interval",
    "check_val_every_n_epoch", "limit_val_batches", "num_sanity_val_steps",
    "enable_model_summary", "deterministic",
)  # fmt: skip


def trainer_keys() -> tuple[str, ...]:
    """Every lightning.Trainer argument: the declared ones and the refused ones."""
    import dataclasses

    declared = [f.name for f in dataclasses.fields(TrainerConfig) if f.name != "_target_"]
    return tuple(declared) + tuple(TrainerConfig.REFUSED)


def world_size(trainer: Mapping[str, Any]) -> int:
    """devices x num_nodes; `devices` may be an int, a list of ids, or "auto" (counts as 1)."""
    devices = trainer.get("devices", 1)
    if isinstance(devices, list | tuple):
        n = len(devices)
    elif isinstance(devices, int) and not isinstance(devices, bool):
        n = devices
    elif isinstance(devices, str) and devices == "auto":
        n = 1
    elif isinstance(devices, str) and devices.lstrip("-").isdigit():
        n = int(devices)
    else:
        raise ConfigError(
            "trainer.devices", f"must be an int, a list of ids or 'auto', got {devices!r}"
        )
    if n == -1:
        n = 1
    if n < 1:
        raise ConfigError("trainer.devices", f"must be >= 1, got {devices!r}")
    return n * int(trainer.get("num_nodes", 1))
