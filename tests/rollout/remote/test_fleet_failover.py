"""The issue's failover test: three `python -m frlab.serve` processes on loopback, an async run of
the toy experiment through the real Trainer / DataModule path (`frlab.train.run`, rollout=remote);
one server is killed with SIGKILL mid-run and restarted later.

Checked: the run finishes its steps; every trajectory the learner saw is complete (one turn, a
whole token budget or a stop) and correctly versioned (its behaviour log-probs are what the
learner's weights AT THE TOKEN'S VERSION give, so the label matches the weights that sampled
it); retries are logged in metrics.csv; the restarted server served nothing until it had loaded
the current snapshot and reported the current version.
"""

from __future__ import annotations

import copy
import csv
import re
import threading
import time
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from helpers.serve import Fleet, free_port, url

STEPS, BATCH, KILL_AT, RESTART_AT, READMIT_BY = 10, 16, 2, 3, 6


class Chaos(L.Callback):
    """Kills / restarts one server at fixed steps; checks every batch against recorded weights."""

    def __init__(self, fleet: Fleet, port: int, checker: Any, max_new_tokens: int) -> None:
        self.fleet, self.port, self.checker = fleet, port, checker
        self.max_new_tokens = max_new_tokens
        self.weights: dict[int, dict[str, torch.Tensor]] = {}
        self.rows_checked = 0
        self.versions_seen: set[int] = set()
        self.log_offset = 0
        self.readmit_version = self.killed_in_flight = -1

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.weights[pl_module.policy_version] = copy.deepcopy(pl_module.policy.state_dict())

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *_: Any) -> None:
        self.weights[pl_module.policy_version] = copy.deepcopy(pl_module.policy.state_dict())

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
        self.check(batch, pl_module.policy_version)
        engine = trainer.datamodule.pool.engine
        victim = next(s for s in engine.servers if s.url == url(self.port))
        if idx == KILL_AT:  # in the background: the pool must keep running to load the victim
            self.killer = threading.Thread(target=self.kill_when_busy, args=(victim,))
            self.killer.start()
        elif idx == RESTART_AT:
            self.restarter = threading.Thread(target=self.restart)
            self.restarter.start()
        elif idx == READMIT_BY:
            self.restarter.join()
            deadline = time.monotonic() + 60
            while victim.state != "ok":
                assert time.monotonic() < deadline, engine.stats()
                time.sleep(0.05)
            self.readmit_version = engine.version

    def kill_when_busy(self, victim: Any) -> None:
        """SIGKILL the victim while it holds requests. A toy request takes milliseconds, so one
        seen in flight may be answered before a kill lands: freeze the server once it has
        some, let answers already on the wire arrive, and kill only if requests are still
        waiting (else thaw it and watch again)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if victim.in_flight:
                self.fleet.freeze(self.port)
                time.sleep(0.05)
                if victim.in_flight:
                    break
                self.fleet.thaw(self.port)
            time.sleep(0.0005)
        self.killed_in_flight = victim.in_flight
        self.fleet.kill(self.port)

    def restart(self) -> None:
        self.killer.join()
        self.log_offset = len(self.fleet.log(self.port))
        self.fleet.start([self.port])

    def check(self, batch: Any, learner_version: int) -> None:
        for i in range(batch.batch_size):
            mask, live = batch.action_mask[i], batch.attention_mask[i]
            versions = set(batch.token_versions[i][mask].tolist())
            assert len(versions) == 1, versions  # one turn: one request, one version
            version = versions.pop()
            assert version <= learner_version and version in self.weights
            assert 1 <= int(mask.sum()) <= self.max_new_tokens
            self.checker.load_state_dict(self.weights[version])
            ids = batch.input_ids[i][live][None]
            with torch.no_grad():
                logits = self.checker(input_ids=ids).logits[0].float()
            lp = torch.log_softmax(logits[:-1], -1).gather(1, ids[0, 1:, None])[:, 0]
            got = batch.behavior_log_probs[i][live][1:][mask[live][1:]]
            assert torch.allclose(got, lp[mask[live][1:]], rtol=0, atol=1e-4), (version, got)
            self.rows_checked += 1
            self.versions_seen.add(version)


@pytest.mark.slow
def test_sigkill_and_restart_of_one_server_mid_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import frlab.train as train
    from frlab.config.compose import compose
    from frlab.model.policy import save_policy

    ports = [free_port() for _ in range(3)]
    cfg = compose(
        [
            "rollout=remote",
            "rollout/engine=remote",
            f"rollout.remote.servers=[{','.join(url(p) for p in ports)}]",
            "rollout.remote.request_timeout_s=10",
            "rollout.remote.probe_interval_s=0.2",
            "rollout.weight_update=drain",  # checked: one version per request
            f"rollout.remote.snapshot_dir={tmp_path / 'snaps'}",
            "rollout.max_in_flight=24",
            f"trainer.max_steps={STEPS}",
            f"data.batch_size={BATCH}",
            f"data.micro_batch_size={BATCH}",
            f"paths.output_dir={tmp_path / 'run'}",
            "plots=false",
        ]
    )
    model_cfg = train.plain(cfg.model)
    save_policy(train.build_policy_from(model_cfg, 123), tmp_path / "model")
    fleet = Fleet(tmp_path / "model", tmp_path)
    chaos = Chaos(
        fleet,
        ports[2],
        train.build_policy_from(model_cfg, 0),
        int(cfg.rollout.sampling.max_new_tokens),
    )
    build_callbacks = train.build_callbacks
    monkeypatch.setattr(train, "build_callbacks", lambda *a: [*build_callbacks(*a), chaos])
    try:
        fleet.start(ports)
        summary = train.run(cfg)
    finally:
        fleet.close()

    assert summary["status"] == "finished" and summary["steps"] == STEPS
    assert chaos.killed_in_flight > 0  # SIGKILL hit a server holding requests
    assert chaos.rows_checked == STEPS * BATCH and len(chaos.versions_seen) > 3
    with (tmp_path / "run" / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == STEPS
    assert float(rows[-1]["rollout/retries"]) > 0
    assert min(float(r["rollout/servers_healthy"]) for r in rows) == 2
    assert float(rows[-1]["rollout/servers_healthy"]) == 3
    assert summary["rollout_stats"]["engine"]["readmissions"] >= 1
    # The restarted server: it loaded a snapshot and proved its version before its first
    # completion, whose tokens carry exactly the last version it proved.
    log = fleet.log(ports[2])[chaos.log_offset :]
    first = log.index("completion:")
    loads = re.findall(r"frlab_load_snapshot v(\d+) loaded", log[:first])
    proofs = re.findall(r"frlab_weight_version -> (\d+)", log[:first])
    assert loads and proofs and loads[0] == proofs[0] and loads[-1] == proofs[-1]
    served = re.match(r"completion: \d+ tokens at versions \[(\d+)\]", log[first:])
    assert served is not None and served.group(1) == proofs[-1]
    assert int(proofs[0]) <= chaos.readmit_version
