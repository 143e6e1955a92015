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
test-only switch (ignore-reload | garbage | hang; see `frlab.serve.server`); with
`--test-faults` it can be flipped at run time (`POST /frlab_test_fault {"fault": NAME}`).

    python -m frlab.serve --host 127.0.0.1 --port 8100 --model /tmp/policy --device cpu
    python -m frlab.serve --port 8100 --model-config configs/model/toy_qwen2.yaml
    python -m frlab.serve --port 8100 --model /tmp/policy --weight-update resubmit
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence

from frlab.rollout.weight_modes import WEIGHT_UPDATES
from frlab.serve.server import FAULTS, ServeState, serve


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
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--initial-version", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch default)")
    p.add_argument(
        "--weight-update", default=None, choices=WEIGHT_UPDATES,
        help="how a snapshot load meets running requests (default: the torch engine's, in_flight)",
    )  # fmt: skip
    p.add_argument("--fault", default="none", choices=FAULTS, help="test-only fault switch")
    p.add_argument(
        "--test-faults",
        action="store_true",
        help="test only: enable POST /frlab_test_fault to flip --fault at run time",
    )
    return p.parse_args(argv)


def build_server_policy(args: argparse.Namespace) -> object:
    """The served model: a folder (`--model`) or a random-init architecture (`--model-config`)."""
    from frlab.model import build_policy

    if args.model is not None:
        return build_policy(args.model, dtype=args.dtype, seed=args.seed)
    from omegaconf import OmegaConf

    spec = OmegaConf.to_container(OmegaConf.load(args.model_config), resolve=True)
    config = spec.get("config") if isinstance(spec, dict) else None
    if not isinstance(config, dict) or "model_type" not in config:
        raise SystemExit(
            f"--model-config {args.model_config}: needs a `config` mapping with a model_type "
            "(like configs/model/toy_qwen2.yaml)"
        )
    return build_policy(None, config=config, dtype=args.dtype, seed=args.seed)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    import torch

    from frlab.rollout.torch.engine import TorchEngine

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    policy = build_server_policy(args)
    engine = TorchEngine(
        policy, device=args.device, max_batch_size=args.max_batch_size, seed=args.seed,
        initial_version=args.initial_version, weight_update=args.weight_update,
    )  # fmt: skip
    del policy
    name = args.served_model_name or args.model or args.model_config
    state = ServeState(engine, name, args.fault, args.test_faults)

    def stop(signum: int, _frame: object) -> None:
        if state.server is not None:
            threading.Thread(target=state.server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    serve(state, args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
