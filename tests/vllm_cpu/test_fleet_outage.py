"""A fleet outage on a REAL vLLM server costs time, never data: the only server of a
`rollout=remote` toy run (vLLM's CPU build, started by the launch recipe, labelling each token
with its weight version: `--enable-scale-out`) is SIGKILLed while it holds the requests of an
update's batch, and started again by the recipe. The run (in this process, through the real
Trainer and DataModule, `rollout.mode=sync`) waits for it, gives it the learner's current
weights before any request, and finishes every update with no prompt dropped: the killed
requests' prompts are requeued and trained on.

The proof that the restarted server samples with the learner's current weights before its
first token is trained on: every batch the learner trains at update s (learner version s, sync:
no lag) holds only tokens vLLM labelled with version s, and the learner's recomputed log-probs
of them match the sampler's (`train/sequence_kl_mean`), before and after the restart.
"""

from __future__ import annotations

import csv
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import pytest
from helpers.vllm_cpu import REPORT, Server, free_port, save_model, wait_for

pytestmark = pytest.mark.vllm_cpu

UPDATES, KILL_AT = 12, 4
KL_EQUAL = 1e-5  # the same weights in vLLM's and the learner's kernels (fp32: ~1e-7)
BACK = "re-admitted at version"


class Records(logging.Handler):
    """The run's log messages (INFO and above)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class KillAndRestart(L.Callback):
    """Records the weight versions vLLM labelled the action tokens of every trained batch
    with; after update KILL_AT, in a thread, runs `outage(engine)`."""

    def __init__(self, outage: Callable[[Any], None]) -> None:
        self.outage = outage
        self.labels: dict[int, set[int]] = {}  # learner version -> labels of its batch
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.restarted_at_version: int | None = None  # the learner's version then

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, *_: Any) -> None:
        labels = batch.token_versions[batch.action_mask.bool()]
        self.labels[int(trainer.global_step)] = {int(v) for v in labels.unique()}

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *_: Any) -> None:
        if trainer.global_step == KILL_AT and self.thread is None:
            engine = trainer.datamodule.pool.engine
            self.thread = threading.Thread(target=self._run, args=(engine,), daemon=True)
            self.thread.start()

    def _run(self, engine: Any) -> None:
        try:
            self.outage(engine)
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            self.error = exc


def kill_when_busy(server: Server, engine: Any) -> None:
    """SIGKILL the server (its whole process group) as soon as it holds requests."""
    (client,) = engine.servers
    wait_for(lambda: client.in_flight > 0, 120, "requests on the server", interval=0.001)
    server.kill()


def toy_run(server: Server, output_dir: Path) -> list[str]:
    """The toy task on the one server, sync mode, `UPDATES` updates."""
    return [
        "rollout=remote",
        "rollout/engine=remote",
        "rollout.mode=sync",
        "rollout.max_policy_lag=1",
        f"rollout.remote.servers=[{server.url}]",
        f"rollout.remote.secret_file={server.secret_file}",
        "rollout.remote.request_timeout_s=60",
        "rollout.remote.startup_timeout_s=120",
        "rollout.remote.fleet_down_timeout_s=900",  # the restart takes minutes on 2 busy cores
        f"trainer.max_steps={UPDATES}",
        "callbacks.model_checkpoint.every_n_train_steps=100000",
        f"paths.output_dir={output_dir}",
        "plots=false",
    ]


def train(overrides: list[str], chaos: L.Callback, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`frlab.train.run` with `chaos` among its callbacks and its log collected."""
    import frlab.train as frlab_train
    from frlab.config.compose import compose

    cfg = compose(overrides)
    built = frlab_train.build_callbacks
    monkeypatch.setattr(frlab_train, "build_callbacks", lambda *a: [*built(*a), chaos])
    records, root = Records(), logging.getLogger()
    level = root.level
    root.addHandler(records)
    root.setLevel(logging.INFO)
    try:
        return frlab_train.run(cfg), records.messages
    finally:
        root.removeHandler(records)
        root.setLevel(level)


def test_the_only_vllm_server_killed_and_restarted_costs_no_prompt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "toy"
    save_model(model)  # the architecture only: the learner's weights arrive as snapshot v0
    server = Server(model, free_port(), 0, tmp_path / "server.log", flags="--enable-scale-out")
    server.start()
    timing: dict[str, float] = {}

    def outage(engine: Any) -> None:
        kill_when_busy(server, engine)
        timing["killed"] = time.monotonic()
        server.start()
        server.wait_healthy(600)
        timing["healthy"] = time.monotonic()

    chaos = KillAndRestart(outage)
    try:
        server.wait_healthy(600)
        summary, messages = train(toy_run(server, tmp_path / "run"), chaos, monkeypatch)
    finally:
        server.kill()
    assert chaos.error is None, chaos.error
    assert summary["status"] == "finished", summary.get("error")
    with (tmp_path / "run" / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["step"]) for r in rows] == list(range(1, UPDATES + 1))

    # no prompt dropped: the killed requests' prompts were requeued, the outage counted once
    stats = summary["rollout_stats"]
    assert stats["failed"] == 0 and stats["rejected"] == 0, stats
    assert stats["requeued"] >= 1 and set(stats["requeued_by_reason"]) == {"engine"}, stats
    assert stats["outages"]["count"] == 1, stats
    down_s = timing["healthy"] - timing["killed"]
    assert stats["outages"]["longest_s"] >= down_s - 1, (stats, down_s)
    assert stats["engine"]["readmissions"] == 1, stats
    assert float(rows[-1]["rollout/requeued"]) == stats["requeued"]

    # re-admitted at the learner's version when it came back (the update it was killed in)
    (back,) = [m for m in messages if BACK in m]
    assert back.endswith(f"{BACK} {KILL_AT}"), back
    # every batch, the first ones after the restart included, was sampled with the learner's
    # current weights: vLLM's version labels say so, the log-probs agree
    assert chaos.labels == {s: {s} for s in range(UPDATES)}, chaos.labels
    kl = [float(r["train/sequence_kl_mean"]) for r in rows]
    assert max(kl) < KL_EQUAL, kl
    # the outage told in a few lines (down, back, one summary every 30 s), none per prompt
    told = [m for m in messages if "rollout fleet" in m or "server " + server.url in m]
    assert len(told) <= 5 + stats["outages"]["longest_s"] / 30, told
    assert not [m for m in messages if m.startswith("rollout of prompt")], messages
    REPORT.append(
        f"the only vLLM CPU server killed mid-update {KILL_AT + 1} and restarted: down "
        f"{stats['outages']['longest_s']:.0f} s (restart {down_s:.0f} s), "
        f"{stats['requeued']} prompts requeued, 0 dropped, {len(told)} outage log lines"
    )
