"""`rollout=remote`: preflight errors name the `rollout.remote` key; a valid config builds a
RemoteEngine with exactly the configured settings (the `rollout.engine` node, instantiated)."""

from __future__ import annotations

from pathlib import Path

import pytest

from frlab.config.compose import compose, instantiate
from frlab.config.errors import ConfigError
from frlab.config.preflight import preflight


def build_engine(cfg, policy, seed):
    """What each rank's pool does: the engine partial called with the policy and its seed."""
    return instantiate(cfg.rollout.engine, key="rollout.engine")(policy=policy, seed=seed)


REMOTE = ["rollout=remote", "rollout/engine=remote"]
ONE = "rollout.remote.servers=[http://127.0.0.1:8100]"


@pytest.mark.parametrize(
    ("overrides", "key", "fragment"),
    [
        (["rollout=remote"], "rollout.remote.servers", "mandatory"),
        # the paper presets pin rollout/engine=vllm: rollout=remote alone is not enough there
        (
            ["experiment=qwen_math_1p5b", "rollout=remote", ONE],
            "rollout.engine",
            "rollout/engine=remote",
        ),
        (["rollout/engine=remote"], "rollout.remote", "rollout=remote"),
        ([*REMOTE, "rollout.remote.servers=[]"], "rollout.remote.servers", "non-empty"),
        ([*REMOTE, "rollout.remote.servers=[127.0.0.1:1]"], "rollout.remote.servers", "http"),
        (
            [*REMOTE, "rollout.remote.servers=[http://a,http://a/]"],
            "rollout.remote.servers",
            "twice",
        ),
        (
            [
                *REMOTE,
                ONE,
                "rollout.remote.weight_sync=nccl",
                "trainer.devices=2",
                "data.micro_batch_size=32",
            ],
            "rollout.remote.weight_sync",
            "one learner rank",
        ),
        (
            [*REMOTE, ONE, "rollout.remote.nccl_master_port=70000"],
            "rollout.remote.nccl_master_port",
            "70000",
        ),
        ([*REMOTE, ONE, "rollout.remote.nccl_packed=maybe"], "rollout.remote.nccl_packed", "maybe"),
        ([*REMOTE, ONE, "rollout.remote.weight_sync=rsync"], "rollout.remote.weight_sync", "rsync"),
        (
            [*REMOTE, ONE, "rollout.remote.request_timeout_s=0"],
            "rollout.remote.request_timeout_s",
            "(0",
        ),
        ([*REMOTE, ONE, "rollout.remote.max_retries=-1"], "rollout.remote.max_retries", "-1"),
        ([*REMOTE, ONE, "+rollout.remote.retries=2"], "rollout.remote.retries", "max_retries"),
        ([*REMOTE, ONE, "model.routing_replay=true"], "model.routing_replay", "torch"),
    ],
)
def test_remote_config_errors_name_the_key(overrides: list[str], key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        preflight(compose(overrides))
    assert info.value.key == key, str(info.value)
    assert fragment in str(info.value)


def test_rollout_remote_alone_selects_the_fleet_for_the_toy_presets() -> None:
    for experiment in ("toy_cpu", "toy_multi_cpu"):
        plan = preflight(compose([f"experiment={experiment}", "rollout=remote", ONE]))
        assert plan["rollout.engine"] == "remote", experiment


def test_a_valid_remote_config_builds_the_configured_engine(tmp_path: Path) -> None:
    from frlab.rollout.remote.engine import RemoteEngine
    from frlab.train import build_policy_from, plain

    servers = "rollout.remote.servers=[http://127.0.0.1:8100,http://127.0.0.1:8101/]"
    cfg = compose(
        [
            *REMOTE,
            servers,
            "rollout.remote.max_retries=5",
            f"rollout.remote.snapshot_dir={tmp_path}",
        ]
    )
    preflight(cfg)
    engine = build_engine(cfg, build_policy_from(plain(cfg.model), 0), seed=3)
    assert isinstance(engine, RemoteEngine)
    assert [s.url for s in engine.servers] == ["http://127.0.0.1:8100", "http://127.0.0.1:8101"]
    assert (engine.max_retries, engine.request_timeout_s, engine.seed) == (5, 120.0, 3)
    assert engine.snapshot_dir == tmp_path and engine.weight_sync == "filesystem"
    engine.shutdown()


def test_a_one_rank_nccl_config_passes_and_builds_the_nccl_engine() -> None:
    from frlab.train import build_policy_from, plain

    cfg = compose(
        [
            *REMOTE,
            ONE,
            "rollout.remote.weight_sync=nccl",
            "rollout.remote.nccl_master_address=10.0.0.7",
            "rollout.remote.nccl_master_port=29500",
        ]
    )
    assert preflight(cfg)["rollout.engine"] == "remote"
    engine = build_engine(cfg, build_policy_from(plain(cfg.model), 0), seed=0)
    nccl = engine._nccl
    assert (nccl.master_address, nccl.master_port, nccl.packed) == ("10.0.0.7", 29500, True)
    assert engine.snapshot_dir is None  # nccl writes snapshots only into a given snapshot_dir
    engine.shutdown()


def test_vllm_engine_args_reach_the_in_process_engine_and_frlab_owned_keys_are_refused() -> None:
    """`rollout.vllm_engine_args` (e.g. the paper presets' gpu_memory_utilization) become vLLM
    AsyncEngineArgs of the in-process engine; keys frlab sets itself are refused by name."""
    cfg = compose(["experiment=qwen_math_1p5b"])
    assert cfg.rollout.vllm_engine_args.gpu_memory_utilization == 0.4
    engine = build_engine(cfg, None, seed=0)
    assert engine.engine_options["gpu_memory_utilization"] == 0.4
    assert engine.engine_options["max_model_len"] == cfg.rollout.max_len == 6144
    assert engine.model_path == "Qwen/Qwen2.5-Math-1.5B"
    with pytest.raises(ConfigError) as info:
        preflight(compose(["experiment=qwen_math_1p5b", "+rollout.vllm_engine_args.seed=3"]))
    assert info.value.key == "rollout.vllm_engine_args" and "seed" in str(info.value)
    fixed = "+rollout.vllm_engine_args.logprobs_mode=raw_logprobs"  # the engine's own rule
    with pytest.raises(ConfigError) as info:
        preflight(compose(["experiment=qwen_math_1p5b", fixed]))
    assert info.value.key == "rollout.vllm_engine_args.logprobs_mode"


@pytest.mark.parametrize("mode", ["drain", "in_flight", "resubmit"])
def test_every_weight_update_mode_passes_preflight_on_a_fleet(mode: str) -> None:
    """The fleet implements the three modes (resubmit: frlab.rollout.remote.resubmit)."""
    from frlab.train import build_policy_from, plain

    cfg = compose([*REMOTE, ONE, f"rollout.weight_update={mode}"])
    assert preflight(cfg)["rollout.engine"] == "remote"
    engine = build_engine(cfg, build_policy_from(plain(cfg.model), 0), seed=0)
    assert engine.weight_update == mode
    engine.shutdown()
