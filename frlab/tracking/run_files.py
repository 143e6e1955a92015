"""`RunFilesCallback`: every run writes `metrics.csv` and `summary.json` into its run folder.

This is the one writer of `metrics.csv` (the default `logger=csv` adds no Lightning logger;
`frlab.tracking.metrics_file` holds the Lightning-free format helpers that read it back).

`metrics.csv` has one row per optimizer step: `step`, `elapsed_s` and every metric the learner
logged under `train/`, `timing/` or `eval/` (names listed in docs/configuration.md), plus the values
other callbacks hand to `log_step_metrics` for that step only (avg@k from
frlab.evaluation, measured every N steps: Lightning would repeat a value logged with
`self.log` in every later row until the epoch ends). `log_step_metrics(metrics, step=N)` puts
them in step N's row even when they arrive late (an evaluation running in the background):
a row already written is updated (the file is rewritten atomically), a step without a row of
its own (step 0: an evaluation before the first update) gets one, placed in step order. Each
row is flushed as it is written, so a crash keeps every finished step. On resume
(`ckpt_path=last`) the file is continued, not overwritten: rows past the restored step
(written after the last checkpoint) are dropped and new rows continue the step count; a
metric that appears later widens the header (the file is rewritten once).

`summary.json` (written atomically at the end, also when training fails or a signal stops it:
`status` finished / failed / interrupted, with the `signal`; a run that fails before training
starts leaves an existing summary.json as it was) holds the number of
steps, the mean reward over the FIRST 10 and the LAST 10 and 20 steps, acceptance and lag
statistics, wall time and updates per minute, the resolved component names, the output
folder and, when the trainer's DataModule has a rollout pool, its counters (`rollout_stats`:
started/finished/failed/rejected by reason, pauses for the lag bound; restored with the pool's
checkpoint, so they cover the whole run across resumes).
"""

from __future__ import annotations

import csv
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from frlab.provenance import frlab_provenance
from frlab.stop import exception_status
from frlab.tracking.metrics_file import (
    FIXED_COLUMNS,
    METRICS_FILE,
    PREFIXES,
    SUMMARY_FILE,
    csv_cells,
    read_metrics,
    scalar_metrics,
    summarize,
    write_json_atomic,
)

log = logging.getLogger(__name__)

RUN_PREFIXES = (*PREFIXES, "eval/", "rollout/")  # eval/: avg@k (AvgAtKEvaluation); rollout/:
# engine counters logged by WeightSyncCallback (remote backend: retries, servers_healthy)


class RunFilesCallback(Callback):
    """Writes metrics.csv (one flushed row per optimizer step) and summary.json (rank 0 only)."""

    def __init__(
        self,
        output_dir: str | os.PathLike[str],
        *,
        components: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
        prefixes: Sequence[str] = RUN_PREFIXES,
    ) -> None:
        self.output_dir = Path(output_dir)
        self.components = dict(components or {})
        self.extra = {"frlab": frlab_provenance(), **(extra or {})}
        self.prefixes = tuple(prefixes)
        self.rows: list[dict[str, float]] = []
        self.columns: list[str] = list(FIXED_COLUMNS)
        self.summary: dict[str, Any] = {}
        self._t0 = time.perf_counter()
        self._elapsed0 = 0.0
        self._fh: Any = None
        self._writer: csv.DictWriter | None = None
        self._staged: dict[str, float] = {}
        self._started = False
        self._staged_steps: dict[int, dict[str, float]] = {}

    @property
    def metrics_path(self) -> Path:
        return self.output_dir / METRICS_FILE

    @property
    def summary_path(self) -> Path:
        return self.output_dir / SUMMARY_FILE

    # -- Lightning hooks ---------------------------------------------------------------------
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.is_global_zero:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        kept = [
            r
            for r in read_metrics(self.metrics_path)
            if r.get("step", math.inf) <= trainer.global_step
        ]
        self.rows = kept
        columns = list(FIXED_COLUMNS)
        for row in kept:
            columns += [k for k in row if k not in columns]
        self.columns = columns
        elapsed = [r["elapsed_s"] for r in kept if math.isfinite(r.get("elapsed_s", math.nan))]
        self._elapsed0 = max(elapsed) if elapsed else 0.0
        self._t0 = time.perf_counter()
        self._rewrite()
        self._started = True

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *_: Any) -> None:
        if not trainer.is_global_zero:
            return
        step = int(trainer.global_step)
        self._flush_staged_steps(below=step)
        row: dict[str, float] = {"step": float(step), "elapsed_s": self._elapsed()}
        row.update(scalar_metrics(dict(trainer.callback_metrics), self.prefixes))
        row.update(self._staged)
        row.update(self._staged_steps.pop(step, {}))
        self._staged = {}
        self.append(row)

    def _elapsed(self) -> float:
        return self._elapsed0 + time.perf_counter() - self._t0

    def log_step_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Add `metrics` to one step's row only: without `step`, the row of the step being
        completed (call from a callback listed earlier); with it, step `step`'s row, written
        now if it exists already, else when that step's row is written."""
        values = {name: float(value) for name, value in metrics.items()}
        if step is None:
            self._staged.update(values)
            return
        for row in self.rows:
            if int(row["step"]) == int(step):
                row.update(values)
                self.columns += [k for k in values if k not in self.columns]
                self._rewrite()
                return
        self._staged_steps.setdefault(int(step), {"elapsed_s": self._elapsed()}).update(values)

    def _flush_staged_steps(self, below: float = math.inf) -> None:
        """Write rows of their own for staged steps below `below` that no update completes."""
        for step in sorted(s for s in self._staged_steps if s < below):
            self.append({"step": float(step), **self._staged_steps.pop(step)}, sort=True)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.is_global_zero:
            self._rollout_stats(trainer)
            self.finish("finished")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if not trainer.is_global_zero or (not self._started and self.summary_path.exists()):
            return  # failed before training started (e.g. a resume): keep the previous files
        self._rollout_stats(trainer)
        fields = exception_status(exception)
        self.extra.update({k: v for k, v in fields.items() if k != "status"})
        self.finish(fields["status"], error=f"{type(exception).__name__}: {exception}")

    def _rollout_stats(self, trainer: Any) -> None:
        """Record the rollout pool's counters (failures, rejections by reason) if there is one."""
        pool = getattr(getattr(trainer, "datamodule", None), "pool", None)
        stats = getattr(pool, "stats", None)
        if callable(stats):
            try:
                self.extra["rollout_stats"] = stats()
            except Exception as exc:  # a broken pool must not lose the summary
                self.extra["rollout_stats"] = {"error": repr(exc)}

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._close()

    # -- file handling ----------------------------------------------------------------------
    def append(self, row: dict[str, Any], sort: bool = False) -> None:
        """Add one step's row; widen the header (rewrite) if it brings a new metric. With
        `sort`, a row that belongs before written rows is placed in step order (rewrite)."""
        self.rows.append(row)
        late = sort and len(self.rows) > 1 and self.rows[-2]["step"] > row["step"]
        if late:
            self.rows.sort(key=lambda r: r["step"])
        new = [k for k in row if k not in self.columns]
        if new or late or self._writer is None:
            self.columns += new
            self._rewrite()
            return
        self._writer.writerow(csv_cells(row))
        self._fh.flush()

    def _rewrite(self) -> None:
        self._close()
        self.output_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.metrics_path.with_suffix(".csv.tmp")
        with tmp.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=self.columns, restval="")
            writer.writeheader()
            writer.writerows(csv_cells(r) for r in self.rows)
        os.replace(tmp, self.metrics_path)
        self._fh = self.metrics_path.open("a", newline="")
        self._writer = csv.DictWriter(self._fh, fieldnames=self.columns, restval="")

    def _close(self) -> None:
        if self._fh is not None:
            self._fh.close()
        self._fh, self._writer = None, None

    def finish(self, status: str, error: str | None = None) -> dict[str, Any]:
        """Close metrics.csv and write summary.json; returns the summary."""
        self._flush_staged_steps()
        self._close()
        summary = summarize(self.rows)
        summary.update(
            status=status,
            objective=self.components,  # {kind: name}, as under the config key `objective`
            output_dir=str(self.output_dir),
            metrics_csv=str(self.metrics_path),
            **self.extra,
        )
        if error:
            summary["error"] = error
        try:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.summary_path, summary)
        except OSError as exc:  # e.g. disk full: never hide the error that ended the run
            log.error("summary.json not written: %s", exc)
        self.summary = summary
        return summary
