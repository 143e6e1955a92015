"""scripts/launch recipes, the FSDP trainer presets and the submitit launcher config.

The recipes run with PRINT_ONLY=1 (print every command instead of running it); the printed
`python -m frlab` overrides are composed and preflighted exactly as a real launch would, the
server lines are checked against the layout (GPUs, ports, tensor parallelism, the worker
extension class), and every `experiment=` / `trainer=` name they use must exist.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from frlab.config.compose import compose
from frlab.config.preflight import preflight

REPO = Path(__file__).resolve().parents[1]
LAUNCH = REPO / "scripts" / "launch"
RECIPES = ("fleet.sh", "single_node.sh", "slurm_learner_fleet.sbatch")
# experiment -> (trainer preset, learner GPUs per node, learner nodes, servers, TP)
LAYOUTS = {
    "r1_distill_1p5b": ("gpu", 1, 1, 7, 1),
    "qwen_math_1p5b": ("gpu", 1, 1, 3, 1),
    "python_tool_qwen7b": ("fsdp_7b", 4, 1, 4, 1),
    "alfworld_qwen7b": ("fsdp_7b", 4, 1, 4, 1),
    "python_tool_qwen3_30b_a3b": ("fsdp_30b_a3b", 8, 2, 4, 2),
}


@pytest.fixture(autouse=True)
def fleet_secret_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fleet's secret file the recipes name (PRINT_ONLY creates none), so that the
    printed learner commands pass preflight as they would after the recipe made it."""
    path = tmp_path / "fleet.secret"
    path.write_text("0123456789abcdef" * 4)
    path.chmod(0o600)
    monkeypatch.setenv("FLEET_SECRET_FILE", str(path))
    return path


def _run(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PRINT_ONLY": "1", "RUN_DIR": "/shared/run", **env}
    return subprocess.run(
        ["bash", str(LAUNCH / script), *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=REPO,
        timeout=60,
    )


def _frlab_overrides(line: str) -> list[str]:
    words = shlex.split(line)
    return words[words.index("frlab") + 1 :]


def _servers(lines: list[str]) -> list[list[str]]:
    """Each server line's words, from `env` on (before it: VLLM_API_KEY read from the file)."""
    words = [shlex.split(x) for x in lines if " vllm serve " in x]
    return [w[w.index("env") :] for w in words]


def _check_learner(overrides: list[str], exp: str, world: int, urls: list[str]) -> None:
    trainer = LAYOUTS[exp][0]
    assert f"experiment={exp}" in overrides and f"trainer={trainer}" in overrides
    assert (REPO / "experiments" / "experiment" / f"{exp}.yaml").is_file()
    assert (REPO / "configs" / "trainer" / f"{trainer}.yaml").is_file()
    cfg = compose(overrides)
    assert (
        cfg.rollout.engine._target_.endswith("RemoteEngine.for_policy")
        and cfg.hydra.run.dir == "/shared/run"
    )
    assert list(cfg.rollout.remote.servers) == urls
    assert cfg.rollout.remote.snapshot_dir == "/shared/run/snapshots"
    assert cfg.trainer.devices * cfg.trainer.num_nodes == world


def _learner_overrides(exp: str) -> list[str]:
    """The frlab overrides of the recipe that launches `exp` (SLURM for multi-node ones)."""
    nodes = LAYOUTS[exp][2]
    if nodes == 1:
        proc = _run("single_node.sh", exp)
    else:
        hosts = " ".join(f"node{i}" for i in range(nodes + 1))
        proc = _run("slurm_learner_fleet.sbatch", exp, FRLAB_NODES=hosts)
    assert proc.returncode == 0, proc.stderr
    return _frlab_overrides(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("exp", list(LAYOUTS))
def test_recipe_learner_commands_pass_preflight(exp: str) -> None:
    _, gpus, nodes, _, _ = LAYOUTS[exp]
    plan = preflight(compose(_learner_overrides(exp)))
    assert plan["ranks"] == gpus * nodes and plan["rollout.engine"] == "remote"


@pytest.mark.parametrize("script", RECIPES)
def test_recipes_pass_bash_syntax_check(script: str) -> None:
    proc = subprocess.run(["bash", "-n", str(LAUNCH / script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("exp", [e for e, lay in LAYOUTS.items() if lay[2] == 1])
def test_single_node_recipe_composes_for_each_one_node_setting(exp: str) -> None:
    _, gpus, _, servers, tp = LAYOUTS[exp]
    proc = _run("single_node.sh", exp, "trainer.max_steps=70")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    served = _servers(lines)
    assert len(served) == servers
    ports = [int(s[s.index("--port") + 1]) for s in served]
    assert ports == list(range(8100, 8100 + servers))
    devices = [s[1] for s in served]  # CUDA_VISIBLE_DEVICES=...: the GPUs after the learner's
    assert devices == [f"CUDA_VISIBLE_DEVICES={gpus + i}" for i in range(servers)]
    assert all(s[s.index("--tensor-parallel-size") + 1] == str(tp) for s in served)
    for s in served:
        ext = s[s.index("--worker-extension-cls") + 1]
        assert ext == "frlab.rollout.vllm.worker_extension.WeightUpdateExtension"
        # the importance ratios need the log-probs of the distribution actually sampled from
        assert s[s.index("--logprobs-mode") + 1] == "processed_logprobs"
        # and no sampling default from the model's generation_config.json
        assert s[s.index("--generation-config") + 1] == "vllm"
    learner = shlex.split(lines[-1])
    assert learner[learner.index("--nproc-per-node") + 1] == str(gpus)
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    overrides = _frlab_overrides(lines[-1])
    assert overrides[-1] == "trainer.max_steps=70"
    _check_learner(overrides, exp, gpus, urls)


def test_worker_extension_class_named_by_the_recipes_exists() -> None:
    module, _, name = "frlab.rollout.vllm.worker_extension.WeightUpdateExtension".rpartition(".")
    assert hasattr(importlib.import_module(module), name)
    assert (
        "frlab.rollout.vllm.worker_extension.WeightUpdateExtension"
        in (LAUNCH / "fleet.sh").read_text()
    )


def test_single_node_recipe_refuses_the_multi_node_setting() -> None:
    proc = _run("single_node.sh", "python_tool_qwen3_30b_a3b")
    assert proc.returncode == 2
    assert "slurm_learner_fleet.sbatch" in proc.stderr


def test_recipes_refuse_an_unknown_experiment() -> None:
    proc = _run("single_node.sh", "qwen_14b")
    assert proc.returncode == 2 and "unknown experiment 'qwen_14b'" in proc.stderr


@pytest.mark.parametrize("exp", ["python_tool_qwen3_30b_a3b", "python_tool_qwen7b"])
def test_slurm_recipe_composes_learner_and_fleet_steps(exp: str) -> None:
    _, gpus, nodes, servers, tp = LAYOUTS[exp]
    hosts = [f"node{i}" for i in range(nodes + 1)]
    proc = _run("slurm_learner_fleet.sbatch", exp, FRLAB_NODES=" ".join(hosts))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    fleet = [shlex.split(x) for x in lines if "start_fleet" in x]
    assert len(fleet) == 1 and f"--nodelist={hosts[-1]}" in fleet[0]
    assert re.search(rf"start_fleet 0 {servers} {tp} 8100 ", fleet[0][-1])
    learner = shlex.split(lines[-1])
    assert learner[:4] == [
        "srun",
        f"--nodes={nodes}",
        f"--ntasks-per-node={gpus}",
        f"--nodelist={','.join(hosts[:-1])}",
    ]
    urls = [f"http://{hosts[-1]}:{8100 + i}" for i in range(servers)]
    _check_learner(_frlab_overrides(lines[-1]), exp, gpus * nodes, urls)


def test_slurm_recipe_refuses_a_wrong_node_count() -> None:
    proc = _run("slurm_learner_fleet.sbatch", "python_tool_qwen3_30b_a3b", FRLAB_NODES="a b")
    assert proc.returncode == 2 and "needs 3 nodes, got 2" in proc.stderr


@pytest.mark.parametrize(("trainer", "world"), [("fsdp", 8), ("fsdp_7b", 4), ("fsdp_30b_a3b", 16)])
def test_fsdp_presets_compose_and_pass_preflight(trainer: str, world: int) -> None:
    cfg = compose([f"trainer={trainer}", "data.micro_batch_size=4"])
    assert cfg.trainer.strategy._target_ == "frlab.learner.sharding.FSDP2Strategy"
    assert cfg.trainer.precision == "bf16-mixed" and cfg.trainer.accelerator == "gpu"
    assert preflight(cfg)["ranks"] == world


@pytest.mark.parametrize(
    ("exp", "trainer"),
    [(e, lay[0]) for e, lay in LAYOUTS.items()],
)
def test_paper_presets_use_the_sized_trainer(exp: str, trainer: str) -> None:
    cfg = compose([f"experiment={exp}"])
    assert cfg.hydra.runtime.choices.trainer == trainer
    assert cfg.model.gradient_checkpointing is True  # activation checkpointing per layer
    preflight(cfg)


def test_submitit_launcher_config_sizes_jobs_from_the_trainer() -> None:
    cfg = compose(["experiment=python_tool_qwen3_30b_a3b", "hydra/launcher=submitit_slurm"])
    launcher = cfg.hydra.launcher
    assert launcher.tasks_per_node == 8 and launcher.gpus_per_node == 8 and launcher.nodes == 2
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")


def test_submitit_launcher_config_matches_the_installed_plugin() -> None:
    plugin = pytest.importorskip(
        "hydra_plugins.hydra_submitit_launcher.config",
        reason="hydra-submitit-launcher not installed (pip install 'frlab[slurm]')",
    )
    import dataclasses

    from hydra.utils import get_class

    cfg = compose(["hydra/launcher=submitit_slurm"])
    fields = {f.name for f in dataclasses.fields(plugin.SlurmQueueConf)}
    assert set(cfg.hydra.launcher) == fields  # this file replaces the plugin's node: all keys
    assert get_class(cfg.hydra.launcher._target_).__name__ == "SlurmLauncher"


@pytest.mark.parametrize("exp", sorted(e for e in LAYOUTS if LAYOUTS[e][2] == 1))
def test_servers_get_the_models_context_as_the_preset_sets_it(exp: str) -> None:
    """Qwen2.5-Math-1.5B declares 4,096 positions: its servers are told 6,144, as the preset's
    in-process vLLM is (rollout.vllm_engine_args.hf_overrides); other models need nothing."""
    import json

    servers = _servers(_run("single_node.sh", exp).stdout.splitlines())
    assert servers
    cfg = compose([f"experiment={exp}"])
    extra = dict(cfg.rollout.get("vllm_engine_args") or {}).get("hf_overrides")
    for words in servers:
        if extra is None:
            assert "--hf-overrides" not in words
        else:
            assert json.loads(words[words.index("--hf-overrides") + 1]) == dict(extra)


def test_a_requeued_slurm_job_reruns_in_its_own_folder() -> None:
    """The job asks SLURM to requeue it (preemption, node failure), and a requeued job keeps
    its id, so its run folder: there frlab resumes from last.ckpt by itself
    (SLURM_RESTART_COUNT; tests/reliability/test_crash_resume.py)."""
    exp = "python_tool_qwen3_30b_a3b"
    assert "#SBATCH --requeue" in (LAUNCH / "slurm_learner_fleet.sbatch").read_text()
    hosts = " ".join(f"node{i}" for i in range(LAYOUTS[exp][2] + 1))
    folders = set()
    for restart in ("0", "1"):
        out = _run(
            "slurm_learner_fleet.sbatch",
            exp,
            FRLAB_NODES=hosts,
            RUN_DIR="",
            SLURM_JOB_ID="4242",
            SLURM_RESTART_COUNT=restart,
        )
        assert out.returncode == 0, out.stderr
        overrides = _frlab_overrides(out.stdout.splitlines()[-1])
        assert not any(o.startswith("ckpt_path=") for o in overrides)  # frlab decides
        folders |= {o for o in overrides if o.startswith("hydra.run.dir=")}
    assert len(folders) == 1 and next(iter(folders)).endswith("/slurm_4242"), folders
