"""Two learner ranks (DDP on CPU, gloo) drive one 2-server `python -m frlab.serve` fleet.

The worker (`fleet_ddp_worker.py`, a standalone script so that Lightning re-launches it and
not pytest) runs `frlab.train.run` on the toy experiment with `trainer=ddp_cpu` and
`rollout=remote`; each rank has its own pool and RemoteEngine on the SAME two servers and a
shared `snapshot_dir`. Weight syncs are collective (frlab.rollout.callbacks.push_collectively):
every rank drains, then pushes; the servers load each version once and deduplicate the other rank's
identical push.

Checked: both ranks finish every step with bit-identical parameters; every trajectory was
sampled in one weight version (no weight change under a request), within the lag bound, and
its behaviour log-probs are what the learner's weights AT THAT VERSION give; no request was
retried or refused as stale; each server loaded every version exactly once; each rank wrote
its snapshots in its own subfolder of the shared folder.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.serve import Fleet, free_port, url

HERE = Path(__file__).resolve().parent
WORKER = HERE / "fleet_ddp_worker.py"
ROOT = HERE.parents[2]
STEPS, MAX_LAG, PER_RANK = 4, 1, 4  # as the worker sets them: lag 1, global batch 8


def run_worker(out: Path, servers: list[str], snapshot_dir: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("MASTER_PORT", None)
    cmd = [
        sys.executable,
        str(WORKER),
        str(out),
        "--servers",
        ",".join(servers),
        "--steps",
        str(STEPS),
        "--snapshot-dir",
        str(snapshot_dir),
    ]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-6000:]


def check_rows(rank: dict[str, Any], weights: dict[int, dict[str, torch.Tensor]]) -> set[int]:
    """Every row: one version, lag within bounds, log-probs of that version's weights."""
    from frlab.config.compose import compose
    from frlab.model.lm_logprobs import sequence_logprobs
    from frlab.train import build_policy_from, plain

    model = build_policy_from(plain(compose([]).model), 0)
    seen: set[int] = set()
    for step, batch in enumerate(rank["batches"]):
        assert batch["learner_version"] == step and batch["input_ids"].shape[0] == PER_RANK
        for i in range(PER_RANK):
            mask = batch["action_mask"][i]
            versions = set(batch["token_versions"][i][mask].tolist())
            assert len(versions) == 1, versions  # one turn = one request = one version
            version = versions.pop()
            assert 0 <= step - version <= MAX_LAG
            model.load_state_dict(weights[version])
            with torch.no_grad():
                want, _ = sequence_logprobs(
                    model,
                    *(batch[k][i : i + 1] for k in ("input_ids", "attention_mask", "position_ids")),
                    action_mask=batch["action_mask"][i : i + 1],
                )
            got = batch["behavior_log_probs"][i][mask]
            assert torch.allclose(got, want[0][mask], rtol=0, atol=1e-4), (version, got)
            seen.add(version)
    return seen


@pytest.mark.slow
def test_two_learner_ranks_share_a_two_server_fleet(tmp_path: Path) -> None:
    from frlab.config.compose import compose
    from frlab.model.policy import save_policy
    from frlab.train import build_policy_from, plain

    save_policy(build_policy_from(plain(compose([]).model), 123), tmp_path / "model")
    ports = [free_port(), free_port()]
    fleet = Fleet(tmp_path / "model", tmp_path)
    out, snaps = tmp_path / "ddp", tmp_path / "snaps"
    try:
        fleet.start(ports)
        run_worker(out, [url(p) for p in ports], snaps)
    finally:
        fleet.close()
    ranks = [torch.load(f"{out}.rank{r}.pt", weights_only=True) for r in (0, 1)]

    for r, rank in enumerate(ranks):
        assert rank["world_size"] == 2 and rank["global_step"] == STEPS
        assert rank["policy_version"] == STEPS and len(rank["batches"]) == STEPS
        assert rank["snapshot_dir"] == str(snaps / f"rank{r}")  # no two ranks write one file
        engine = rank["pool"]["engine"]
        assert engine["retries"] == engine["stale_refusals"] == engine["server_faults"] == 0
        assert engine["servers_healthy"] == 2 and rank["pool"]["weight_syncs"] == STEPS + 1
    p0, p1 = ranks[0]["params"], ranks[1]["params"]
    assert p0.keys() == p1.keys() and all(torch.equal(p0[k], p1[k]) for k in p0)
    w0, w1 = ranks[0]["weights"], ranks[1]["weights"]
    assert sorted(w0) == sorted(w1) == list(range(STEPS + 1))
    assert not torch.equal(w0[0]["model.embed_tokens.weight"], p0["model.embed_tokens.weight"])
    for version in w0:
        assert all(torch.equal(w0[version][k], w1[version][k]) for k in w0[version])
    seen = check_rows(ranks[0], w0) | check_rows(ranks[1], w1)
    assert 0 in seen and max(seen) >= STEPS - 1 - MAX_LAG  # the lag bound forces new versions
    newest = w0[max(seen)]  # so the log-prob check above told versions apart
    assert not all(torch.equal(newest[k], w0[0][k]) for k in newest)
    prompts = [set(torch.cat([b["prompt_ids"] for b in r["batches"]]).tolist()) for r in ranks]
    assert not prompts[0] & prompts[1]  # each rank its own prompt stream
    for port in ports:  # each version loaded once per server; the other pushes deduplicated
        log = fleet.log(port)
        loaded = [int(v) for v in re.findall(r"frlab_load_snapshot v(\d+) loaded", log)]
        deduplicated = re.findall(r"frlab_load_snapshot v(\d+) deduplicated", log)
        assert loaded == list(range(STEPS + 1)), loaded
        # v0: 2 ranks x (engine start + train start) = 4 pushes; later versions 2 pushes
        assert len(deduplicated) == 3 + STEPS, deduplicated
        assert "completion:" in log
