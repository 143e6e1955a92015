"""Every frlab config key, declared once: type (the annotation), default, range and meaning.

These dataclasses are Hydra structured configs (registered by `frlab.config.compose`): the
root `FrlabConfig` is the first entry of `configs/train.yaml`'s defaults list, so Hydra
checks types and refuses unknown keys while it composes, and a group option (a YAML file)
only holds the values that differ from the defaults declared here. Preflight (ranges and
choices: `frlab.config.declare.check_values`), the dry-run plan and the key reference `docs/config-keys.md`
(`python -m frlab.generated --write`) read the same declarations.

Nodes whose keys depend on the chosen class stay open mappings (`Any`): `env` (the
environment's constructor arguments), `objective` (checked by the objective itself), `logger`,
`callbacks`, `eval` (frlab.config.evaluation), the engine node `rollout.engine` and the fleet
`rollout.remote` (both declared in frlab.config.engines).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import II, MISSING

from frlab.config.declare import spec
from frlab.config.schema_trainer import TrainerConfig
from frlab.rollout.weight_modes import WEIGHT_UPDATES

__all__ = ["FrlabConfig", "TrainerConfig"]


@dataclass
class LoraConfig:
    """LoRA adapters on the policy (frlab.model.lora, built with peft): only they train and
    only they are pushed to the engine. rank 0: the full model trains."""

    rank: int = spec(0, low=0, doc="adapter rank; 0: no adapters (full fine-tune)")
    alpha: float = spec(16.0, low=0.0, low_open=True, doc="adapter scale alpha / rank")
    dropout: float = spec(0.0, low=0.0, high=1.0, high_open=True, doc="on the adapters' input")
    target_modules: list[str] = spec(
        factory=lambda: ["all-linear"], doc="module-name suffixes to adapt, or [all-linear]: "
        "every linear layer but the LM head and MoE routers")  # fmt: skip
    adapter: str | None = spec(None, doc="a saved peft adapter folder to start from")


@dataclass
class ModelConfig:
    """The policy: a pretrained causal LM or a random-init architecture."""

    _target_: str = spec("frlab.model.policy.build_policy", doc="builds the policy (seed given)")
    name_or_path: str | None = spec(
        MISSING, doc="Hugging Face id, local folder or gguf:NAME / gguf:/path.gguf; null: random "
        "init from `config`")  # fmt: skip
    config: dict[str, Any] | None = spec(
        None, doc="mapping for transformers.AutoConfig.for_model (needs model_type); null "
        "when name_or_path loads a checkpoint")  # fmt: skip
    tokenizer: str = spec(
        II("model.name_or_path"), arg=False,
        doc="`toy` (frlab.model.toy_tokenizer) or a Hugging Face id / folder / gguf source",
    )  # fmt: skip
    dtype: str = spec("float32", choices=("float32", "bfloat16", "float16", "float64"),
                      doc="learner master weights; compute precision is trainer.precision")  # fmt: skip
    gradient_checkpointing: Any = spec(
        False, kind=bool, words=("auto",), doc="recompute activations in backward; auto: only "
        "where a whole trajectory would not fit without it (frlab.model.auto_memory)")  # fmt: skip
    compile: bool = spec(
        False, arg=False, doc="torch.compile each decoder layer of the learner (packed lengths "
        "bucketed; recompiles counted in train/compiles)")  # fmt: skip
    logprob_chunk_size: int = spec(1024, low=1, arg=False, doc="tokens per LM-head chunk")
    routing_replay: bool = spec(
        False, arg=False, doc="MoE: replay the sampler's experts (needs an engine whose "
        "class declares records_routing; a dry run names them)")  # fmt: skip
    trust_remote_code: bool = spec(False, doc="passed to transformers")
    attn_implementation: str | None = spec(
        None, doc="transformers attention; null: eager on CPU-only machines, else sdpa"
    )
    lora: LoraConfig = spec(factory=LoraConfig)


@dataclass
class SamplingConfig:
    """How every turn is sampled (`frlab.rollout.engine.SamplingParams`)."""

    temperature: float = spec(1.0, low=0.0, low_open=True, doc="the learner applies it too")
    top_p: float = spec(1.0, low=0.0, high=1.0, low_open=True,
                        doc="1: full support (needed by off-policy correction)")  # fmt: skip
    top_k: int = spec(0, low=0, doc="0: off (needed by off-policy correction)")
    max_new_tokens: int = spec(16, low=1, doc="generation budget of one turn")


@dataclass
class RolloutConfig:
    """Rollout collection: the pool, the agent loop and its engine."""

    mode: str = spec("async", choices=("async", "sync"),
                     doc="async: first B finished form a batch; sync: collect, then train")  # fmt: skip
    engine: Any = spec(None, doc="the engine node: an option of the config group rollout/engine")
    max_in_flight: int = spec(32, low=1, doc="rollouts running at once")
    max_policy_lag: int = spec(4, low=0, doc="admission-control bound on policy lag")
    weight_update: str | None = spec(
        None, choices=WEIGHT_UPDATES, doc="what requests in flight see when new weights land: "
        "in_flight (keep their KV cache, go on with the new weights), resubmit (fresh prefill "
        "of prompt + tokens on the new weights), drain (the update waits for them); null: the "
        "engine's default, in_flight where its per-token versions make it exact")  # fmt: skip
    samples_per_prompt: int = spec(1, low=1, doc="G; > 1 only for group baselines (mode sync)")
    sync_every: int = spec(1, low=1, doc="push weights every N steps; <= max_policy_lag (async)")
    max_turns: int = spec(1, low=1, doc="turns per episode")
    max_len: int = spec(64, low=2, doc="tokens per trajectory (prompt + all turns)")
    env_timeout_s: float = spec(
        300.0, low=0.0, low_open=True, arg=False, doc="deadline of one environment call (build, "
        "reset, step); a call past it fails its rollout (env_step_timeout, ...) and is "
        "abandoned")  # fmt: skip
    engine_timeout_s: float = spec(
        1800.0, low=0.0, low_open=True, arg=False,
        doc="deadline of one engine request (one turn's generation)")  # fmt: skip
    adaptive_deadlines: bool = spec(
        True, arg=False, doc="true: each kind of call's deadline is 10x the p99 of its recent "
        "times (after 32 returned), between the floor below and env_timeout_s / "
        "engine_timeout_s, so a hung call costs one rollout, not a stall; false: the fixed "
        "values")  # fmt: skip
    env_timeout_floor_s: float = spec(2.0, low=0.0, low_open=True, arg=False,
                                      doc="the adaptive env deadline's lower bound")  # fmt: skip
    engine_timeout_floor_s: float = spec(60.0, low=0.0, low_open=True, arg=False,
                                         doc="the adaptive engine deadline's lower bound")  # fmt: skip
    sampling: SamplingConfig = spec(factory=SamplingConfig)
    device: str = spec("cpu", doc="device of the in-process engine (torch)")
    remote: Any = spec(None, doc="the fleet (RemoteConfig), set by rollout=remote")
    vllm_engine_args: dict[str, Any] | None = spec(
        factory=dict, doc="rollout/engine=vllm only: extra vLLM AsyncEngineArgs, e.g. "
        "{gpu_memory_utilization: 0.4}")  # fmt: skip


@dataclass
class DataConfig:
    """The learner batch (`frlab.data.datamodule.RolloutDataModule`)."""

    _target_: str = "frlab.data.datamodule.RolloutDataModule"
    batch_size: int = spec(16, low=1, doc="B trajectories per optimizer step (global)")
    micro_batch_size: int = spec(16, low=1, arg=False,
                                 doc="at most this many rows per forward/backward on one rank; "
                                 "divides B / ranks")  # fmt: skip
    max_tokens_per_micro_batch: Any = spec(
        None, low=1, arg=False, kind=int, words=("auto",), doc="also at most this many tokens "
        "per micro-batch (packed: sum of lengths; padded: rows x longest); rows grouped longest "
        "first; a longer trajectory runs alone; null: rows only; auto: the most that fits the "
        "learner's device (frlab.model.auto_memory)")  # fmt: skip
    pack_sequences: bool = spec(
        True, arg=False, doc="each micro-batch as ONE padding-free row, attention per trajectory "
        "(sdpa/eager: per-trajectory sdpa; flash_attention_2/3: varlen); exact (same loss and "
        "gradient as padded rows); other model.attn_implementation values need false")  # fmt: skip


@dataclass
class OptimConfig:
    """AdamW, one optimizer step per learner batch, and its schedule (frlab.learner.optim)."""

    _target_: str = "torch.optim.AdamW"
    _partial_: bool = True
    lr: float = spec(1.0e-6, low=0.0, low_open=True)
    weight_decay: float = spec(0.1, low=0.0)
    betas: list[float] = spec(factory=lambda: [0.9, 0.999], pair=True, low=0.0, high=1.0,
                              high_open=True)  # fmt: skip
    eps: float = spec(1.0e-8, low=0.0, low_open=True)
    grad_clip: float = spec(1.0, low=0.0, arg=False, doc="total grad-norm clip; 0 disables")
    scheduler: str = spec("cosine", choices=("cosine", "constant"), arg=False)
    warmup_ratio: float = spec(0.0, low=0.0, high=1.0, high_open=True, arg=False,
                               doc="linear warmup over warmup_ratio * max_steps")  # fmt: skip
    min_lr_ratio: float = spec(0.0, low=0.0, high=1.0, arg=False,
                               doc="cosine floor as a fraction of lr")  # fmt: skip
    schedule_steps: int | None = spec(
        None, low=1, arg=False, doc="the lr schedule's length in updates (a preset may stop "
        "earlier, at trainer.max_steps); null: trainer.max_steps")  # fmt: skip
    skip_zero_signal_steps: bool = spec(
        False, arg=False, doc="true: a batch whose gradient is exactly 0 (all advantages 0, every "
        "trajectory rejected or every token filtered) leaves weights and AdamW state untouched "
        "and skips the work it can; a frlab choice, off in the paper presets (the reference "
        "steps AdamW on every batch)")  # fmt: skip


@dataclass
class PathsConfig:
    """Where runs are written."""

    log_dir: str = spec("outputs", doc="runs under <log_dir>/runs, sweeps under <log_dir>/multirun")
    output_dir: str = spec(II("hydra:runtime.output_dir"), doc="this run's folder")


@dataclass
class FrlabConfig:
    """The root config (`configs/train.yaml`)."""

    seed: int = spec(0, low=0)
    dry_run: bool = spec(False, doc="validate, print the plan, exit 0 (nothing is loaded)")
    ckpt_path: str | None = spec(None, doc="null | last | /path/to.ckpt (resume)")
    task_name: str = "train"
    plots: bool = spec(True, doc="PNG curves into <run>/plots at the end")
    overwrite: bool = spec(
        False, doc="true: a new run may replace another run's files in its run folder (else "
        "refused: resume with ckpt_path=last or choose another folder)")  # fmt: skip
    user_modules: list[str] = spec(
        factory=list, doc="your packages whose classes configs may name as _target_ "
        "(e.g. [mypkg]); standard-library and framework packages are refused")  # fmt: skip
    model: ModelConfig = spec(factory=ModelConfig)
    env: Any = spec(None, doc="the environment: _target_ + its constructor arguments")
    rollout: RolloutConfig = spec(factory=RolloutConfig)
    data: DataConfig = spec(factory=DataConfig)
    objective: Any = spec(None, doc="component names + per-component kwargs (objective group)")
    optim: OptimConfig = spec(factory=OptimConfig)
    trainer: TrainerConfig = spec(factory=TrainerConfig)
    logger: Any = spec(None, doc="a Lightning logger node (logger=csv|tensorboard|wandb)")
    callbacks: Any = spec(None, doc="name -> Lightning callback node; null entries skipped")
    paths: PathsConfig = spec(factory=PathsConfig)
    eval: Any = spec(None, doc="evaluation during training (eval group); null: off")


# The typed sections of the root whose values preflight checks and the plan compares with their
# defaults, in this order (`paths` holds Hydra's folder).
SECTIONS: dict[str, type] = {"model": ModelConfig, "rollout": RolloutConfig, "data": DataConfig,
                             "optim": OptimConfig, "trainer": TrainerConfig}  # fmt: skip


def declaration_for(target: str) -> type | None:
    """The declared section whose default `_target_` is `target` (None if none is)."""
    from frlab.config.engines import ENGINES
    from frlab.config.evaluation import EVALS

    for cls in (ModelConfig, DataConfig, OptimConfig, TrainerConfig, *ENGINES.values(),
                *EVALS.values()):  # fmt: skip
        if getattr(cls, "_target_", None) == target:
            return cls
    return None
