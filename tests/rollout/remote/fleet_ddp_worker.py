"""Standalone worker for the 2-rank learner on a server fleet (never collected by pytest).

`python fleet_ddp_worker.py OUT --servers URL,URL --steps N --snapshot-dir DIR` runs
`frlab.train.run` on the toy
experiment with `trainer=ddp_cpu` (2 CPU ranks, gloo; Lightning re-launches this script for
rank 1) and `rollout=remote` on the given `python -m frlab.serve` servers. A recording callback
keeps, on every rank, each batch the learner trained on and the learner weights at every
version; at the end each rank writes `OUT.rank{R}.pt` with its final parameters, step counts,
those batches and weights, and its pool and engine counters.

The parity reward is replaced (in this process only) by "the reply has an even number of
characters": a random-init policy earns it about half the time, so every update has a
non-zero gradient and successive weight versions really differ (parity itself is rarely
earned in a few steps, which would leave the weights unchanged and every version identical).
"""

from __future__ import annotations

import argparse
import copy
from typing import Any

import lightning as L
import torch

BATCH = 8  # global: 4 trajectories per rank and step
FIELDS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "action_mask",
    "behavior_log_probs",
    "token_versions",
    "prompt_ids",
)


class Recorder(L.Callback):
    """Keeps every training batch (with the learner version it trained at) and the weights of
    every learner version, then saves them with the final state on train end."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.batches: list[dict[str, Any]] = []
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    def _keep_weights(self, pl_module: Any) -> None:
        self.weights[int(pl_module.policy_version)] = copy.deepcopy(pl_module.policy.state_dict())

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        self._keep_weights(pl_module)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, i: int) -> None:
        row = {name: getattr(batch, name).detach().cpu().clone() for name in FIELDS}
        self.batches.append({**row, "learner_version": int(pl_module.policy_version)})

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, *_: Any) -> None:
        self._keep_weights(pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        pool = trainer.datamodule.pool
        result = {
            "params": {k: v.detach().clone() for k, v in pl_module.policy.state_dict().items()},
            "policy_version": int(pl_module.policy_version),
            "global_step": int(trainer.global_step),
            "world_size": int(trainer.world_size),
            "batches": self.batches,
            "weights": self.weights,
            "pool": pool.stats(),
            "snapshot_dir": str(pool.engine.snapshot_dir),
        }
        torch.save(result, f"{self.out}.rank{trainer.global_rank}.pt")


def even_length(action_text: str, digit: int) -> bool:
    """The test reward (replaces envs.toy.single.same_parity): an even-length reply."""
    return len(action_text) % 2 == 0


def overrides(servers: list[str], steps: int, run_dir: str, snapshot_dir: str) -> list[str]:
    """The toy experiment on 2 CPU ranks and the remote fleet, small and quick."""
    return [
        "trainer=ddp_cpu",
        f"trainer.max_steps={steps}",
        "rollout=remote",
        "rollout/engine=remote",
        f"rollout.remote.servers=[{','.join(servers)}]",
        f"rollout.remote.snapshot_dir={snapshot_dir}",
        "rollout.remote.request_timeout_s=60",
        "rollout.remote.probe_interval_s=0.2",
        "rollout.weight_update=drain",  # checked: no weight change under a request
        "rollout.max_in_flight=8",
        "rollout.max_policy_lag=1",
        "rollout.max_len=64",
        "rollout.sampling.max_new_tokens=24",
        f"data.batch_size={BATCH}",
        f"data.micro_batch_size={BATCH // 2}",
        f"paths.output_dir={run_dir}",
        "plots=false",
        "~callbacks.model_checkpoint",
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--servers", required=True, help="comma-separated base URLs")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--snapshot-dir", required=True, help="shared by the ranks")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import envs.toy.single
    import frlab.train as train
    from frlab.config.compose import compose

    envs.toy.single.same_parity = even_length

    servers = args.servers.split(",")
    cfg = compose(overrides(servers, args.steps, f"{args.out}-run", args.snapshot_dir))
    recorder = Recorder(args.out)
    build_callbacks = train.build_callbacks
    train.build_callbacks = lambda *a: [*build_callbacks(*a), recorder]
    train.run(cfg)


if __name__ == "__main__":
    main()
