"""Chaos against real `python -m frlab.serve` processes on loopback: a fleet outage costs time,
never data. Toy runs through the real Trainer / DataModule path (`frlab.train.run`,
rollout=remote) meet, after their third update:

- the only server killed (SIGKILL while it holds requests) and restarted 20 s later;
- the only server stopped (SIGSTOP while it holds requests, as the learner pushes its next
  weights) for 20 s, then continued;
- the only server answering HTTP 503 to everything for 10 s (`--fault unavailable`);
- one of three servers flapping: unavailable and back every 5 s for a minute.

Each run finishes with 0 prompts dropped, the counters telling what happened (requeued
prompts, outages, seconds the fleet was down, re-admissions), and a log of a few lines per
event: the lines logged from the fault until the first update after it, besides the one line a
weight sync logs per update anyway, stay within the budget.
"""

from __future__ import annotations

import csv
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import yaml
from helpers.serve import Fleet, free_port, save_tiny_model, set_fault, url

REPO = Path(__file__).resolve().parents[3]
BATCH = 16
SYNC_LINE = "remote engine: weights v"  # logged once per update, outage or not


class Lines(logging.Handler):
    """Every log record of the run (INFO and above), with its time."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def between(self, start: float, end: float) -> list[str]:
        return [r.getMessage() for r in list(self.records) if start <= r.created <= end]


class Chaos(L.Callback):
    """After update START_AT runs `prelude(engine)` (if any) at once, in the learner's thread,
    then `act(engine)` in a thread; stops the run AFTER updates past the update that came first
    once `act` returned. Placed before the weight sync's callback, a prelude's fault meets the
    weight push of update START_AT."""

    START_AT, AFTER = 3, 3

    def __init__(
        self, act: Callable[[Any], None], prelude: Callable[[Any], None] | None = None
    ) -> None:
        self.act, self.prelude = act, prelude
        self.thread: threading.Thread | None = None
        self.started = self.acted = self.resumed = 0.0
        self.done_at: int | None = None
        self.error: BaseException | None = None

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *_: Any) -> None:
        step = trainer.global_step
        if step == self.START_AT and self.thread is None:
            engine = trainer.datamodule.pool.engine
            self.thread = threading.Thread(target=self._act, args=(engine,), daemon=True)
            self.started = time.time()
            if self.prelude is not None:
                self.prelude(engine)
            self.thread.start()
        elif self.thread is not None and self.done_at is None and not self.thread.is_alive():
            self.done_at, self.resumed = step, time.time()
        if self.done_at is not None and step >= self.done_at + self.AFTER:
            trainer.should_stop = True

    def _act(self, engine: Any) -> None:
        try:
            self.act(engine)
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            self.error = exc
        self.acted = time.time()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, list[int]]]:
    root = tmp_path_factory.mktemp("outages")
    toy = yaml.safe_load((REPO / "configs/model/toy_qwen2.yaml").read_text())["config"]
    save_tiny_model(root / "model", config=toy)  # the CPU default's architecture
    fleet = Fleet(root / "model", root, extra=["--test-faults"])
    ports = [free_port() for _ in range(3)]
    try:
        fleet.start(ports, timeout=300)
        yield fleet, ports
    finally:
        fleet.close()


def toy_overrides(
    output_dir: Path, ports: list[int], *extra: str, max_steps: int = 10000
) -> list[str]:
    """A toy run on `ports` writing to `output_dir` (by default until a callback stops it)."""
    return [
        "rollout=remote",
        f"rollout.remote.servers=[{','.join(url(p) for p in ports)}]",
        "rollout.remote.probe_interval_s=0.5",
        "rollout.remote.probe_backoff_max_s=2",
        f"rollout.max_in_flight={BATCH}",
        f"data.batch_size={BATCH}",
        f"data.micro_batch_size={BATCH}",
        f"trainer.max_steps={max_steps}",
        "callbacks.model_checkpoint.every_n_train_steps=100000",
        f"paths.output_dir={output_dir}",
        "plots=false",
        *extra,
    ]


def train_with(
    overrides: list[str],
    callbacks: list[L.Callback],
    monkeypatch: pytest.MonkeyPatch,
    first: bool = False,
) -> tuple[dict[str, Any], Lines]:
    """`frlab.train.run` with `callbacks` added (`first`: before the run's own); its summary
    and log."""
    import frlab.train as train
    from frlab.config.compose import compose

    cfg = compose(overrides)
    build = train.build_callbacks
    both = (lambda *a: [*callbacks, *build(*a)]) if first else (lambda *a: [*build(*a), *callbacks])
    monkeypatch.setattr(train, "build_callbacks", both)
    lines, root = Lines(), logging.getLogger()
    level = root.level
    root.addHandler(lines)
    root.setLevel(logging.INFO)
    try:
        return train.run(cfg), lines
    finally:
        root.removeHandler(lines)
        root.setLevel(level)


def run_with(
    tmp_path: Path,
    ports: list[int],
    act: Callable[[Any], None],
    monkeypatch: pytest.MonkeyPatch,
    prelude: Callable[[Any], None] | None = None,
    extra: tuple[str, ...] = (),
) -> tuple[dict[str, Any], list[dict[str, str]], Chaos, Lines]:
    """A toy run on `ports` (with the `extra` overrides) with `act` (and `prelude`) as its
    chaos; its summary, metrics rows, chaos, log."""
    chaos = Chaos(act, prelude)
    overrides = toy_overrides(tmp_path / "run", ports, *extra)
    summary, lines = train_with(overrides, [chaos], monkeypatch, first=prelude is not None)
    assert chaos.error is None, chaos.error
    with (tmp_path / "run" / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    return summary, rows, chaos, lines


def when_busy(fleet: Fleet, port: int, engine: Any) -> None:
    """Freeze the server (SIGSTOP) as soon as it holds requests, so the fault meets them (every
    wait below has a deadline)."""
    server = next(s for s in engine.servers if s.url == url(port))
    deadline = time.monotonic() + 60
    while not server.in_flight:
        assert time.monotonic() < deadline, "the server never held a request"
        time.sleep(0.001)
    fleet.freeze(port)


def outage_lines(chaos: Chaos, lines: Lines) -> list[str]:
    """What the fault added to the log: from the fault to the first update after it."""
    window = lines.between(chaos.started, chaos.resumed)
    return [line for line in window if not line.startswith(SYNC_LINE)]


def told_once(told: list[str], budget: int) -> list[str]:
    """The outage's lines: within `budget`, the fleet's outage told once as it began and once
    as it ended (never a line per prompt or per retry)."""
    assert len(told) <= budget, told
    assert sum("rollout fleet down (" in line for line in told) == 1, told
    assert sum("rollout fleet back after" in line for line in told) == 1, told
    assert not any(line.startswith("rollout of prompt") for line in told), told
    return told


def assert_nothing_dropped(summary: dict[str, Any]) -> dict[str, Any]:
    assert summary["status"] == "finished", summary.get("error")
    stats = summary["rollout_stats"]
    assert stats["failed"] == 0 and stats["rejected"] == 0, stats
    assert stats["consumed"] >= summary["steps"] * BATCH
    return stats


@pytest.mark.slow
def test_the_only_server_killed_and_restarted_20_s_later(
    servers: tuple[Fleet, list[int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet, ports = servers
    port = ports[0]

    def act(engine: Any) -> None:
        when_busy(fleet, port, engine)
        fleet.kill(port)
        time.sleep(20)
        fleet.start([port], timeout=300)

    summary, rows, chaos, lines = run_with(tmp_path, [port], act, monkeypatch)
    stats = assert_nothing_dropped(summary)
    assert stats["requeued"] >= 1 and set(stats["requeued_by_reason"]) == {"engine"}, stats
    assert stats["outages"]["count"] == 1 and stats["outages"]["longest_s"] >= 20, stats
    assert stats["engine"]["readmissions"] == 1
    assert float(rows[-1]["rollout/requeued"]) == stats["requeued"]
    assert float(rows[-1]["rollout/fleet_down_s"]) >= 20
    told_once(outage_lines(chaos, lines), budget=12)


@pytest.mark.slow
def test_the_only_server_stopped_for_20_s_then_continued(
    servers: tuple[Fleet, list[int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped under requests as the learner pushes its next weights: the push and the
    requests give up on it at its liveness deadline (request_timeout_s: the default 120 s),
    the prompts are requeued, and it is re-admitted once it answers again."""
    fleet, ports = servers
    port = ports[1]

    def act(engine: Any) -> None:
        time.sleep(20)
        fleet.thaw(port)

    try:
        # the prelude holds the learner before its push: a lag bound that still admits rollouts
        stop = lambda e: when_busy(fleet, port, e)  # noqa: E731
        summary, rows, chaos, lines = run_with(
            tmp_path, [port], act, monkeypatch, prelude=stop, extra=("rollout.max_policy_lag=8",)
        )
    finally:
        fleet.thaw(port)
    stats = assert_nothing_dropped(summary)
    assert stats["requeued"] >= 1 and stats["outages"]["count"] == 1, stats
    assert stats["outages"]["longest_s"] >= 5, stats  # from its liveness deadline to its return
    assert stats["engine"]["readmissions"] == 1
    assert float(rows[-1]["rollout/fleet_down_s"]) == pytest.approx(stats["fleet_down_s"], abs=0.01)
    told = told_once(outage_lines(chaos, lines), budget=12)
    assert any("GET /health gave no 200" in line for line in told), told


@pytest.mark.slow
def test_the_only_server_answering_503_for_10_s(
    servers: tuple[Fleet, list[int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet, ports = servers
    port = ports[2]

    def act(engine: Any) -> None:
        set_fault(port, "unavailable")
        time.sleep(10)
        set_fault(port, "none")

    try:
        summary, rows, chaos, lines = run_with(tmp_path, [port], act, monkeypatch)
    finally:
        set_fault(port, "none")
    stats = assert_nothing_dropped(summary)
    assert stats["outages"]["count"] == 1 and stats["outages"]["longest_s"] >= 10, stats
    assert stats["engine"]["readmissions"] == 1
    assert float(rows[-1]["rollout/fleet_down_s"]) >= 10
    told = told_once(outage_lines(chaos, lines), budget=12)
    assert "HTTP 503" in "\n".join(told), told


@pytest.mark.slow
def test_one_of_three_servers_flapping_every_5_s_for_a_minute(
    servers: tuple[Fleet, list[int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet, ports = servers
    flapping = ports[2]

    def act(engine: Any) -> None:
        for _ in range(6):
            set_fault(flapping, "unavailable")
            time.sleep(5)
            set_fault(flapping, "none")
            time.sleep(5)

    try:
        summary, rows, chaos, lines = run_with(tmp_path, ports, act, monkeypatch)
    finally:
        set_fault(flapping, "none")
    stats = assert_nothing_dropped(summary)
    assert stats["outages"]["count"] == 0 and float(rows[-1]["rollout/fleet_down_s"]) == 0
    assert stats["engine"]["readmissions"] >= 3 and stats["engine"]["server_faults"] >= 3
    told = outage_lines(chaos, lines)
    downs = [line for line in told if "down (dead)" in line]
    assert 3 <= len(downs) <= 6 and len(told) <= 3 * 6, told  # about one down + one back a flap


class Prompts(L.Callback):
    """The prompt ids of every batch trained, by update."""

    def __init__(self) -> None:
        self.trained: dict[int, list[int]] = {}

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, *_: Any) -> None:
        self.trained[int(trainer.global_step)] = batch.prompt_ids.tolist()


def checkpointed_pool(run: Path) -> dict[str, Any]:
    """The rollout pool's state in the run's last.ckpt."""
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    return ckpt["RolloutDataModule"]["pool"]


@pytest.mark.slow
def test_a_run_resumed_after_the_deadline_trains_the_prompts_the_outage_requeued(
    servers: tuple[Fleet, list[int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The only server killed under requests and not back within fleet_down_timeout_s: the
    run stops (EngineDown, exit 75 from the command line) with the requeued prompts in its
    checkpoint; once the server is back, the resumed run trains them first, drops none."""
    from frlab.rollout.engine import EngineDown

    fleet, ports = servers
    port, run = ports[0], tmp_path / "run"

    def act(engine: Any) -> None:
        when_busy(fleet, port, engine)
        fleet.kill(port)

    chaos = Chaos(act)
    first = toy_overrides(run, [port], "rollout.remote.fleet_down_timeout_s=5")
    try:
        with pytest.raises(EngineDown, match="fleet_down_timeout_s=5"):
            train_with(first, [chaos], monkeypatch)
    finally:
        fleet.start([port], timeout=300)
    assert chaos.error is None, chaos.error
    pool = checkpointed_pool(run)
    requeued = [prompt for prompt, _ in pool["requeues"]]
    times = sum(count for _, count in pool["requeues"])
    assert 1 <= len(requeued) <= BATCH, pool["requeues"]
    assert set(requeued) <= {p["prompt_id"] for p in pool["pending"]}
    stopped_at = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]

    prompts = Prompts()
    resume = toy_overrides(run, [port], "ckpt_path=last", max_steps=stopped_at + 2)
    summary, _ = train_with(resume, [prompts], monkeypatch)
    assert summary["status"] == "finished", summary.get("error")
    stats = summary["rollout_stats"]
    assert stats["failed"] == 0 and stats["rejected"] == 0, stats  # both runs' totals
    assert stats["requeued_by_reason"] == {"engine": times}, stats  # restored, none since
    assert stats["outages"]["count"] == 1, stats  # the one the run stopped in, restored
    assert sorted(prompts.trained) == [stopped_at, stopped_at + 1], prompts.trained
    trained = prompts.trained[stopped_at] + prompts.trained[stopped_at + 1]
    assert all(trained.count(p) == 1 for p in requeued), (requeued, prompts.trained)
