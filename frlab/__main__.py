"""`python -m frlab [group=option ...] [key=value ...]` (console script `frlab`).

Hydra composes `configs/train.yaml` (+ `experiments/` on the search path) over frlab's
structured configs and runs `frlab.train.run` for each job: its preflight, then the plan
(`dry_run=true`) or the training run. Hydra's callbacks (configs/hydra/default.yaml) check
the machine once per real job (frlab.run.hydra_record) and guard the run folder. Exit codes: a
config error, from Hydra's composition or frlab's checks (a fleet server refusing the
learner's secret too), prints `frlab: config error: ...` naming the key and exits 2; a failure
exits 1 (disk full: one line naming the folder); 75 when the rollout engine went down for good
(the last step is checkpointed: resume with `ckpt_path=last` once it is back); 130 / 143 when
SIGINT / SIGTERM stopped the run (frlab.run.guard). A job SLURM requeued resumes from its run
folder's last.ckpt. With no arguments the CPU default experiment `toy_cpu` runs.
"""

from __future__ import annotations

import sys
from typing import Any

import hydra
from omegaconf import DictConfig

from frlab.config.compose import call_hydra_main, setup_hydra
from frlab.errors import ConfigError

setup_hydra()
ENGINE_DOWN_EXIT = 75  # EX_TEMPFAIL (sysexits.h): the rollout engine went down for good


@hydra.main(config_path="../configs", config_name="train", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> dict[str, Any]:
    """One job: `frlab.train.run`, its errors as exit codes."""
    from frlab.fsio import DiskFullError
    from frlab.rollout.engine import EngineDown
    from frlab.stop import RunInterrupted
    from frlab.train import run

    try:
        return run(cfg)
    except ConfigError as exc:  # a fleet server refusing the secret is one too
        print(f"frlab: config error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    except DiskFullError as exc:
        print(f"frlab: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    except EngineDown as exc:  # 75 = EX_TEMPFAIL: the run may resume once the engine is back
        from frlab.run.guard import exit_now

        print(
            f"frlab: error: {exc}; the last step is checkpointed: resume with ckpt_path=last "
            "once the engine is back",
            file=sys.stderr,
            flush=True,
        )
        exit_now(ENGINE_DOWN_EXIT)
    except RunInterrupted as exc:  # SIGINT -> 130, SIGTERM -> 143 (what schedulers expect)
        from frlab.run.guard import exit_now

        print(f"frlab: {exc}", file=sys.stderr, flush=True)
        exit_now(exc.exit_code)
    raise AssertionError("not reached")  # every branch above returns or exits


def main() -> None:
    """Console entry point: Hydra's main, a composition error printed as a config error."""
    call_hydra_main(_hydra_main)


if __name__ == "__main__":
    main()
