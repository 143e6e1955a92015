"""The exact `vllm serve` commands frlab documents, parsed by vLLM's own argument parser (the
`serve` subcommand's, vllm/entrypoints/cli/serve.py + vllm/entrypoints/launchers/cli_args.py),
and the engine arguments vLLM builds from them: the launch recipes (scripts/launch, printed
with PRINT_ONLY=1) and every `vllm serve` command of the engines guide (docs/engines.md)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm_contract

REPO = Path(__file__).resolve().parents[2]
EXTENSION = "frlab.rollout.vllm.worker_extension.WeightUpdateExtension"
GUARD = "frlab.rollout.remote.auth.FleetGuard"
GUIDE = REPO / "docs" / "engines.md"  # the documented `vllm serve` commands


def serve_parser():  # noqa: ANN201
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    return parser


def vllm_argv(words: list[str]) -> list[str]:
    """The words after `vllm` of a command line (env assignments before it dropped)."""
    return words[words.index("vllm") + 1 :]


def recipe_servers() -> list[list[str]]:
    env = {**os.environ, "PRINT_ONLY": "1", "RUN_DIR": "/shared/run"}
    out = subprocess.run(
        ["bash", str(REPO / "scripts/launch/single_node.sh"), "qwen_math_1p5b"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
        check=True,
    ).stdout
    return [vllm_argv(shlex.split(x)) for x in out.splitlines() if " vllm serve " in x]


def guide_servers() -> list[list[str]]:
    text = GUIDE.read_text()
    joined = re.sub(r"\\\n\s*", " ", text)  # shell line continuations
    lines = [x.strip() for x in joined.splitlines() if "vllm serve " in x and "`" not in x]
    return [vllm_argv(shlex.split(x)) for x in lines]


def check(argv: list[str], local_model: Path) -> None:
    """Parse `argv` as `vllm serve` does, then build AsyncEngineArgs from it (the model id is
    swapped for a local folder: offline, vLLM resolves hub ids to a local snapshot)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    args = serve_parser().parse_args(argv)
    assert args.subparser == "serve" and args.model_tag == argv[1]
    args.model = str(local_model)
    assert args.worker_extension_cls == EXTENSION
    assert args.logprobs_mode == "processed_logprobs"
    assert args.generation_config == "vllm"
    assert args.middleware[-1] == GUARD  # frlab's guard, added last: the outermost
    assert args.host not in (None, "", "0.0.0.0") and args.api_key is None  # key: environment
    engine_args = AsyncEngineArgs.from_cli_args(args)
    assert engine_args.logprobs_mode == "processed_logprobs"
    assert engine_args.generation_config == "vllm"
    assert engine_args.worker_extension_cls == EXTENSION


@pytest.fixture(scope="module")
def local_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from helpers.vllm_contract import tiny_model

    return tiny_model(tmp_path_factory.mktemp("cli") / "tiny")


def test_the_launch_recipes_serve_flags_parse_in_vllm(local_model: Path) -> None:
    servers = recipe_servers()
    assert len(servers) == 3
    for argv in servers:
        check(argv, local_model)


def test_the_guides_vllm_serve_commands_parse_in_vllm(local_model: Path) -> None:
    servers = guide_servers()
    assert len(servers) >= 2
    for argv in servers:
        check(argv, local_model)
    nccl = [a for a in servers if "--weight-transfer-config" in a]
    assert nccl, "the guide's NCCL server command"
    args = serve_parser().parse_args(nccl[0])
    assert args.weight_transfer_config.backend == "nccl"


def test_the_routed_experts_flag_parses_on_every_release(local_model: Path) -> None:
    """MoE routing replay needs the engine's routed experts: `--enable-return-routed-experts`
    parses into the engine arguments on every supported release (the flag stayed when the
    setting moved into the auxiliary-output config in 0.31; building that config then also
    needs vLLM's second model runner, which on a CPU needs Triton with a CPU backend)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    argv = [
        "serve",
        str(local_model),
        "--enable-return-routed-experts",
        "--skip-tokenizer-init",
        "--max-model-len",
        "128",
        "--enforce-eager",
    ]
    args = serve_parser().parse_args(argv)
    args.model = args.model_tag
    assert AsyncEngineArgs.from_cli_args(args).enable_return_routed_experts is True
    plain = serve_parser().parse_args(argv[:2])
    plain.model = plain.model_tag
    assert AsyncEngineArgs.from_cli_args(plain).enable_return_routed_experts is False


def test_the_recipes_lora_flags_parse_into_vllms_lora_config(local_model: Path) -> None:
    """LORA_RANK=R adds runtime LoRA loading (its environment switch) and a LoRA config of rank
    R and one adapter slot, as vLLM builds them from the recipe's own command line."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    script = 'source scripts/launch/fleet.sh && start_server 0 8000 "$MODEL" 1 128'
    env = {
        **os.environ,
        "PRINT_ONLY": "1",
        "LORA_RANK": "16",
        "MODEL": str(local_model),
        "HOST": "127.0.0.1",
        "FLEET_SECRET_FILE": "/run/fleet.secret",
    }
    line = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
        check=True,
    ).stdout.strip()
    words = shlex.split(line)
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in words[: words.index("vllm")]
    argv = vllm_argv(words)
    check(argv, local_model)
    args = serve_parser().parse_args(argv)
    args.model = str(local_model)
    lora = AsyncEngineArgs.from_cli_args(args).create_engine_config().lora_config
    assert lora is not None and lora.max_lora_rank == 16 and lora.max_loras == 1
