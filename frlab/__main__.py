"""`python -m frlab [group=option ...] [key=value ...]` (console script `frlab`).

Thin on purpose: Hydra composes `configs/train.yaml` (+ `experiments/` on the search path),
`task` runs the preflight (validation, the resolved plan), prints the plan and stops for
`dry_run=true`, and otherwise hands over to `frlab.train.run`. Exit codes: 2 for a config
error, 1 for a failure (disk full: one line naming the folder), 130 / 143 when SIGINT / SIGTERM
stopped the run (frlab.run_guard). Before Hydra starts, `main`
checks group choices and dotted keys on the command line so that a typo gets a message that
names the key and suggests the closest valid names. With no arguments the embedded CPU
default experiment `toy_cpu` runs.
"""

from __future__ import annotations

import sys
from typing import Any

import hydra
from omegaconf import DictConfig

from frlab.config.errors import ConfigError
from frlab.config.overrides import check_overrides
from frlab.config.resolvers import register_resolvers
from frlab.config.searchpath import register_search_path

register_search_path()
register_resolvers()


def task(cfg: DictConfig) -> dict[str, Any]:
    """One job: preflight, then the dry-run plan or the training run's summary."""
    from frlab.config.preflight import preflight

    plan = preflight(cfg)
    if cfg.dry_run:
        print(plan.format(), flush=True)
        return plan.to_dict()
    from frlab.train import run

    return run(cfg, plan=plan)


@hydra.main(config_path="../configs", config_name="train", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> dict[str, Any]:
    from frlab.fsio import DiskFullError
    from frlab.stop import RunInterrupted

    try:
        return task(cfg)
    except ConfigError as exc:
        print(f"frlab: config error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    except DiskFullError as exc:
        print(f"frlab: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    except RunInterrupted as exc:  # SIGINT -> 130, SIGTERM -> 143 (what schedulers expect)
        from frlab.run_guard import exit_now

        print(f"frlab: {exc}", file=sys.stderr, flush=True)
        exit_now(exc.exit_code)
        raise  # not reached


def main() -> None:
    """Console entry point."""
    try:
        check_overrides(sys.argv[1:])
    except ConfigError as exc:
        print(f"frlab: config error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    _hydra_main()


if __name__ == "__main__":
    main()
