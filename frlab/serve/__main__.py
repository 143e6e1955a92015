"""CLI of `python -m frlab.serve` (a test and CPU vehicle, not a replacement for vLLM).

`--model` is a local model folder (e.g. written by `frlab.model.policy.save_policy`, or any
Hugging Face causal-LM folder); it is loaded with `frlab.model.build_policy`. `--model-config`
instead random-inits the architecture of a model config file (`configs/model/toy_qwen2.yaml`:
its `config` mapping): the learner loads its own weights onto every server before the first
rollout, so only the architecture has to match. The server starts
at weight version `--initial-version` (0) and serves until SIGTERM / SIGINT.
`--weight-update in_flight|resubmit|drain` is its torch engine's `weight_update` (default: the
torch engine's own, in_flight): what requests running on this server see when a snapshot
lands (in_flight: they keep their KV cache and go on with the new weights; resubmit: they go on
from a fresh prefill of prompt + tokens on the new weights; drain: the load waits for them);
every token is labelled with the version that sampled it either way. It is reported in
`/server_info` (`frlab_weight_update`): a fleet run with `rollout.weight_update=in_flight` or
`resubmit` refuses a server in another mode. `--fault` is a
test-only switch (ignore-reload | garbage | hang | unavailable; see `frlab.serve.server`); with
`--test-faults` it can be flipped at run time (`POST /frlab_test_fault {"fault": NAME}`).

Who may call it: with a fleet secret (the file `--secret-file` or `FRLAB_FLEET_SECRET_FILE`
names, else the variable `--secret-env` or `FRLAB_FLEET_SECRET_ENV` names, default
`FRLAB_FLEET_SECRET`) every route but `GET /health` needs it as a bearer token (401
otherwise); without one it refuses to listen anywhere but on loopback unless
`--allow-unauthenticated` is given. Snapshots are read only from below `--snapshot-root`
(default `FRLAB_SNAPSHOT_ROOT`; unset: anywhere).

    python -m frlab.serve --host 127.0.0.1 --port 8100 --model /tmp/policy --device cpu
    python -m frlab.serve --port 8100 --model-config configs/model/toy_qwen2.yaml
    python -m frlab.serve --port 8100 --model /tmp/policy --weight-update resubmit
    FRLAB_FLEET_SECRET_FILE=run/fleet.secret python -m frlab.serve --host 10.0.0.7 \
        --port 8100 --model-config configs/model/toy_qwen2.yaml --snapshot-root run/snapshots
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from frlab.rollout.engine import WEIGHT_UPDATES
from frlab.rollout.remote import auth
from frlab.rollout.remote.hosts import is_loopback_url
from frlab.rollout.vllm.worker_extension import SNAPSHOT_ROOT_VAR
from frlab.serve.server import FAULTS, ServeState, serve

log = logging.getLogger("frlab.serve")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m frlab.serve", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="local model folder (save_policy output)")
    source.add_argument(
        "--model-config", help="model config file (YAML/JSON); random-init its `config` mapping"
    )
    p.add_argument("--served-model-name", default=None, help="id in /v1/models (default: --model)")
    declared = "(default: the declared default of "
    p.add_argument("--device", help=f"{declared}rollout.engine.device)")
    p.add_argument("--seed", type=int, help=f"{declared}seed)")
    p.add_argument(
        "--dtype", choices=("float32", "bfloat16", "float16"), help=f"{declared}model.dtype)"
    )
    p.add_argument("--max-batch-size", type=int, help=f"{declared}rollout.engine.max_batch_size)")
    p.add_argument("--initial-version", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch default)")
    p.add_argument(
        "--weight-update",
        default=None,
        choices=WEIGHT_UPDATES,
        help="how a snapshot load meets running requests (default: the torch engine's, in_flight)",
    )
    p.add_argument("--fault", default="none", choices=FAULTS, help="test-only fault switch")
    p.add_argument(
        "--test-faults",
        action="store_true",
        help="test only: enable POST /frlab_test_fault to flip --fault at run time",
    )
    p.add_argument(
        "--secret-file",
        default=None,
        help=f"file holding the fleet secret (default: ${auth.SECRET_FILE_VAR})",
    )
    p.add_argument(
        "--secret-env",
        default=None,
        help="variable holding the fleet secret "
        f"(default: ${auth.SECRET_ENV_VAR}, else {auth.DEFAULT_SECRET_ENV})",
    )
    p.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="listen off loopback without a fleet secret (anyone may call it)",
    )
    p.add_argument(
        "--snapshot-root",
        default=os.environ.get(SNAPSHOT_ROOT_VAR) or None,
        help=f"read weight snapshots only below this folder (default: ${SNAPSHOT_ROOT_VAR})",
    )
    return with_declared_defaults(p.parse_args(argv))


def with_declared_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """The flags left out take the config declarations' defaults (one home for each)."""
    from frlab.config.arguments import declared_arguments
    from frlab.config.schema import FrlabConfig, ModelConfig, TorchEngineConfig

    engine = declared_arguments(TorchEngineConfig)
    declared = {
        "device": engine["device"],
        "max_batch_size": engine["max_batch_size"],
        "dtype": declared_arguments(ModelConfig, name_or_path=None)["dtype"],
        "seed": FrlabConfig.seed,
    }
    for name, value in declared.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def server_digest(args: argparse.Namespace) -> bytes | None:
    """The digest of the fleet secret this server checks (None: none); SystemExit when it
    would listen off loopback without one and `--allow-unauthenticated` is not given."""
    env = dict(os.environ)
    if args.secret_file:
        env[auth.SECRET_FILE_VAR] = args.secret_file
    if args.secret_env:
        env[auth.SECRET_ENV_VAR] = args.secret_env
    try:
        secret = auth.server_secret(env)
    except auth.SecretError as exc:
        raise SystemExit(f"frlab.serve: {exc}") from None
    host = f"[{args.host}]" if ":" in args.host else args.host
    if secret is None and not is_loopback_url(f"http://{host}"):
        if not args.allow_unauthenticated:
            raise SystemExit(
                f"frlab.serve: --host {args.host} is off loopback and no fleet secret is set "
                f"({auth.SECRET_FILE_VAR} or {auth.DEFAULT_SECRET_ENV}): anyone could replace "
                "its weights; set one, or pass --allow-unauthenticated"
            )
        log.warning(
            "frlab.serve listens on %s without a fleet secret: anyone who reaches it "
            "may call every route",
            args.host,
        )
    return None if secret is None else auth.digest(secret)


def build_server_policy(args: argparse.Namespace) -> object:
    """The served model: a folder (`--model`) or a random-init architecture (`--model-config`)."""
    from frlab.config.arguments import declared_arguments
    from frlab.config.schema import ModelConfig
    from frlab.model import build_policy

    model = declared_arguments(ModelConfig, name_or_path=args.model, config=None, dtype=args.dtype)
    if args.model is not None:
        return build_policy(**model, seed=args.seed)
    from omegaconf import OmegaConf

    spec = OmegaConf.to_container(OmegaConf.load(args.model_config), resolve=True)
    config = spec.get("config") if isinstance(spec, dict) else None
    if not isinstance(config, dict) or "model_type" not in config:
        raise SystemExit(
            f"--model-config {args.model_config}: needs a `config` mapping with a model_type "
            "(like configs/model/toy_qwen2.yaml)"
        )
    return build_policy(**{**model, "config": config}, seed=args.seed)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    digest = server_digest(args)  # before the model loads: a bad secret fails at once
    import torch

    from frlab.config.arguments import declared_arguments
    from frlab.config.schema import TorchEngineConfig
    from frlab.rollout.torch.engine import TorchEngine

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    policy = build_server_policy(args)
    settings = declared_arguments(
        TorchEngineConfig,
        device=args.device,
        max_batch_size=args.max_batch_size,
        weight_update=args.weight_update,
    )
    engine = TorchEngine(policy, seed=args.seed, initial_version=args.initial_version, **settings)
    del policy
    name = args.served_model_name or args.model or args.model_config
    state = ServeState(
        engine,
        name,
        args.fault,
        args.test_faults,
        secret_digest=digest,
        snapshot_root=args.snapshot_root and Path(args.snapshot_root),
    )

    def stop(signum: int, _frame: object) -> None:
        if state.server is not None:
            threading.Thread(target=state.server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    serve(state, args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
