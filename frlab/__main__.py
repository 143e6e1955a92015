"""`python -m frlab [group=option ...] [key=value ...]` (console script `frlab`).

Thin on purpose: Hydra composes `configs/train.yaml` (+ `experiments/` on the search path) over
frlab's structured configs (frlab.config.schema), and `task` runs one job: for a real run the
cheap checks of the machine first (devices, model and data sources, frlab.run.machine),
then the preflight (validation, the resolved plan); it prints the plan and stops for
`dry_run=true`, and otherwise hands over to `frlab.train.run`. Every config error, from Hydra's
composition or from frlab's checks (and a fleet server refusing the learner's secret at
start), is printed as `frlab: config error: ...` naming the key and exits with code 2; a failure exits 1 (disk full: one line naming the folder), 75 when the
rollout engine went down for good (a dead engine process, a fleet down past
`rollout.remote.fleet_down_timeout_s`: the last step is checkpointed, resume with
`ckpt_path=last` once it is back), and 130 / 143 when SIGINT / SIGTERM stopped the run
(frlab.run.guard). A job SLURM requeued resumes from its run folder's last.ckpt
(frlab.run.folder.requeue_resume). With no arguments the embedded CPU default experiment
`toy_cpu` runs.
"""

from __future__ import annotations

import sys
from typing import Any

import hydra
from omegaconf import DictConfig

from frlab.config.compose import legacy_overrides, setup_hydra
from frlab.config.declare import check_bool_overrides
from frlab.config.engines import TYPED_NODES
from frlab.config.errors import ConfigError, call_hydra_main
from frlab.config.schema import FrlabConfig

setup_hydra()
ENGINE_DOWN_EXIT = 75  # EX_TEMPFAIL (sysexits.h): the rollout engine went down for good


def task(cfg: DictConfig) -> dict[str, Any]:
    """One job: preflight, then the dry-run plan or the training run's summary."""
    from frlab.config.preflight import preflight
    from frlab.run.folder import resume_if_requeued
    from frlab.run.machine import check_machine

    if not cfg.dry_run:
        check_machine(cfg)
        resume_if_requeued(cfg)  # a job SLURM requeued resumes from its last.ckpt
    plan = preflight(cfg)
    if cfg.dry_run:
        from frlab.config.plan import learner_plan

        learner_plan(cfg, plan)  # kernels, auto budget and checkpointing, the memory plan
        print(plan.format(), flush=True)
        return plan.to_dict()
    from frlab.train import run

    return run(cfg, plan=plan)


@hydra.main(config_path="../configs", config_name="train", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> dict[str, Any]:
    from frlab.fsio import DiskFullError
    from frlab.rollout.engine import EngineDown
    from frlab.rollout.remote.auth import FleetAuthError
    from frlab.stop import RunInterrupted

    try:
        return task(cfg)
    except (ConfigError, FleetAuthError) as exc:  # a fleet server refused the secret: config
        print(f"frlab: config error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    except DiskFullError as exc:
        print(f"frlab: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    except EngineDown as exc:  # 75 = EX_TEMPFAIL: the run may resume once the engine is back
        from frlab.run.guard import exit_now

        print(f"frlab: error: {exc}; the last step is checkpointed: resume with ckpt_path=last "
              "once the engine is back", file=sys.stderr, flush=True)  # fmt: skip
        exit_now(ENGINE_DOWN_EXIT)
    except RunInterrupted as exc:  # SIGINT -> 130, SIGTERM -> 143 (what schedulers expect)
        from frlab.run.guard import exit_now

        print(f"frlab: {exc}", file=sys.stderr, flush=True)
        exit_now(exc.exit_code)
        raise  # not reached


def main() -> None:
    """Console entry point."""
    sys.argv[1:] = legacy_overrides(sys.argv[1:])
    try:
        args = [a for a in sys.argv[1:] if not a.startswith("-")]
        check_bool_overrides(FrlabConfig, args, TYPED_NODES)
    except ConfigError as exc:
        print(f"frlab: config error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    call_hydra_main(_hydra_main)


if __name__ == "__main__":
    main()
