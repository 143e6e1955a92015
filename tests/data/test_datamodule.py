"""RolloutDataModule end to end: real torch engine, agent loop, toy env, FlashREINFORCE learner.

Checks: Lightning receives collated `RolloutBatch`es with lag info, weights reach the engine
every step (WeightSyncCallback), sync mode with G samples runs under Lightning without a
prefetch deadlock, every thread is joined after fit and after a failing fit, the data cursor
round-trips, and DDP ranks get disjoint prompt-id shards of B/W.
"""

from __future__ import annotations

import random
import threading
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
from helpers.learner import learner_module

from envs.base import Env, StepResult
from frlab.config.schema import RolloutConfig
from frlab.data.batch import RolloutBatch
from frlab.data.datamodule import RolloutDataModule
from frlab.defaults import agent_loop_config, sampling_params, torch_engine
from frlab.model.toy_tokenizer import build_toy_tokenizer
from frlab.objective.presets import PRESETS
from frlab.rollout.callbacks import WeightSyncCallback
from frlab.rollout.pool import RolloutPool
from frlab.rollout.torch.engine import TorchEngine

B, LAG = 4, 2
MODEL = {
    "config": {
        "model_type": "qwen2",
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 64,
    },
    "seed": 0,
}
OBJECTIVE = {**PRESETS["flashreinforce"], "sequence_bernoulli_kl": {"delta": 3e-3}}
OPTIM = {"lr": 1e-2, "weight_decay": 0.0, "grad_clip": 1.0, "scheduler": "constant"}


class SayDigitEnv(Env):
    """One turn: "say 7" -> reward 1 when the reply's first digit is 7."""

    def __init__(self) -> None:
        self.digit = -1

    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        return {"digit": rng.randrange(10)}

    def reset(self, task) -> list[dict[str, str]]:
        self.digit = int(task["digit"])
        return [{"role": "user", "content": f"say {self.digit}"}]

    def step(self, action_text: str) -> StepResult:
        digits = [c for c in action_text if c.isdigit()]
        return StepResult(None, float(digits[:1] == [str(self.digit)]), True, {})


class Rig:
    """A learner module plus a pool factory whose engine starts from the learner's weights."""

    def __init__(self, mode: str = "async", g: int = 1) -> None:
        self.module = learner_module(MODEL, OBJECTIVE, OPTIM, batch_size=B, micro_batch_size=B)
        self.tokenizer = build_toy_tokenizer()
        self.mode, self.g = mode, g
        self.engines: list[TorchEngine] = []
        self.shards: list[dict[str, Any]] = []

    def factory(self, **shard: Any) -> RolloutPool:
        self.shards.append(shard)
        engine = torch_engine(self.module.policy, max_batch_size=8, seed=len(self.engines))
        self.engines.append(engine)
        cfg = agent_loop_config(max_turns=1, max_len=32, sampling=sampling_params(max_new_tokens=3))
        return RolloutPool(
            engine,
            SayDigitEnv,
            self.tokenizer,
            cfg,
            task_sampler=SayDigitEnv.task_sampler(),
            max_in_flight=8,
            max_policy_lag=LAG,
            mode=self.mode,
            samples_per_prompt=self.g,
            max_prompt_retries=RolloutConfig.max_prompt_retries,
            off_policy_correction=True,
            num_env_workers=2,
            **shard,
        )

    def datamodule(self) -> RolloutDataModule:
        return RolloutDataModule(self.factory, batch_size=B, batch_timeout_s=60)


class Recorder(L.Callback):
    def __init__(self, fail_at: int | None = None) -> None:
        self.batches: list[Any] = []
        self.fail_at = fail_at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batches.append(batch)
        if batch_idx == self.fail_at:
            raise RuntimeError("training loop failure")


def fit(rig: Rig, max_steps: int, recorder: Recorder) -> RolloutDataModule:
    dm = rig.datamodule()
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[WeightSyncCallback(sync_every=1), recorder],
    )
    trainer.fit(rig.module, datamodule=dm)
    return dm


def test_fit_yields_rollout_batches_with_lag_and_syncs_weights_and_joins_threads() -> None:
    before = set(threading.enumerate())
    rig, rec = Rig(), Recorder()
    dm = fit(rig, 3, rec)
    assert set(threading.enumerate()) == before and dm.pool is None
    assert len(rec.batches) == 3
    for step, batch in enumerate(rec.batches):
        assert isinstance(batch, RolloutBatch) and batch.batch_size == B
        width = batch.input_ids.shape[1]
        for name in ("attention_mask", "action_mask", "behavior_log_probs", "token_versions"):
            assert getattr(batch, name).shape == (B, width)
        assert batch.action_mask.any(dim=1).all()
        assert len(set(batch.prompt_ids.tolist())) == B  # one rollout per prompt
        assert [info["learner_version"] for info in batch.infos] == [step] * B
        assert all(0 <= info["policy_lag_max"] <= LAG for info in batch.infos)
        assert all(info["policy_lag_min"] <= info["policy_lag_max"] for info in batch.infos)
    engine = rig.engines[0]
    assert engine.version == rig.module.policy_version == 3
    for name, p in rig.module.policy.state_dict().items():
        assert torch.equal(engine.model.state_dict()[name], p), name


def test_sync_mode_with_groups_runs_under_lightning_with_zero_lag() -> None:
    rig, rec = Rig(mode="sync", g=2), Recorder()
    fit(rig, 2, rec)
    for batch in rec.batches:
        assert sorted(torch.bincount(batch.prompt_ids).tolist())[-2:] == [2, 2]
        assert all(info["policy_lag_max"] == 0 for info in batch.infos)


def test_a_failing_fit_still_stops_the_pool_and_joins_every_thread() -> None:
    before = set(threading.enumerate())
    rig, rec = Rig(), Recorder(fail_at=1)
    dm = rig.datamodule()
    trainer = L.Trainer(
        max_steps=5,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[WeightSyncCallback(sync_every=1), rec],
    )
    with pytest.raises(RuntimeError, match="training loop failure"):
        trainer.fit(rig.module, datamodule=dm)
    assert dm.pool is None
    assert set(threading.enumerate()) == before


def test_datamodule_state_round_trip_resumes_the_prompt_cursor() -> None:
    rig = Rig()
    dm = rig.datamodule()
    dm.setup("fit")
    try:
        batches = iter(dm.train_dataloader())
        seen = [pid for _ in range(2) for pid in next(batches).prompt_ids.tolist()]
        state = dm.state_dict()
    finally:
        dm.teardown("fit")
    resumed = rig.datamodule()
    resumed.load_state_dict(state)
    resumed.setup("fit")
    try:
        more = next(iter(resumed.train_dataloader())).prompt_ids.tolist()
        counter = resumed.pool.stats()["prompts"]
    finally:
        resumed.teardown("fit")
    assert not set(more) & set(seen)
    assert counter >= state["pool"]["prompt_counter"]
    assert more[0] >= 0 and len(set(seen + more)) == 3 * B


def test_ranks_get_disjoint_prompt_shards_of_b_over_w() -> None:
    rig = Rig()
    dm = rig.datamodule()
    dm.trainer = SimpleNamespace(
        global_rank=1, world_size=2, max_steps=5, accumulate_grad_batches=1
    )
    dm.setup("fit")
    try:
        loader = dm.train_dataloader()
        assert len(loader) == 5
        batch = next(iter(loader))
    finally:
        dm.teardown("fit")
    assert rig.shards == [dict(batch_size=2, seed=1, prompt_id_offset=1, prompt_id_stride=2)]
    assert batch.batch_size == 2 and all(pid % 2 == 1 for pid in batch.prompt_ids.tolist())
    bad = rig.datamodule()
    bad.trainer = SimpleNamespace(
        global_rank=0, world_size=3, max_steps=5, accumulate_grad_batches=1
    )
    with pytest.raises(ValueError, match="data.batch_size"):
        bad.setup("fit")


def test_each_rank_saves_and_resumes_its_own_pool_cursor(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig()
    ranks = [rig.datamodule() for _ in range(2)]
    for rank, dm in enumerate(ranks):
        dm.trainer = SimpleNamespace(
            global_rank=rank, world_size=2, max_steps=3, accumulate_grad_batches=1
        )
        dm.setup("fit")
    try:
        firsts = [next(iter(dm.train_dataloader())).prompt_ids.tolist() for dm in ranks]
        states = [dm.pool.state_dict() for dm in ranks]
    finally:
        for dm in ranks:
            dm.teardown("fit")

    def gather(out: list, obj: Any) -> None:  # what all_gather_object does across 2 ranks
        out[:] = states

    monkeypatch.setattr(torch.distributed, "all_gather_object", gather)
    ranks[0].pool = SimpleNamespace(state_dict=lambda: states[0])
    saved = ranks[0].state_dict()
    ranks[0].pool = None
    assert saved == {"pools": states}
    resumed = rig.datamodule()
    resumed.trainer = SimpleNamespace(
        global_rank=1, world_size=2, max_steps=3, accumulate_grad_batches=1
    )
    resumed.load_state_dict(saved)
    resumed.setup("fit")
    try:
        more = next(iter(resumed.train_dataloader())).prompt_ids.tolist()
    finally:
        resumed.teardown("fit")
    assert all(pid % 2 == 1 for pid in more) and not set(more) & set(firsts[1])
    with pytest.raises(ValueError, match="same number of devices"):
        three = rig.datamodule()
        three.trainer = SimpleNamespace(
            global_rank=0, world_size=3, max_steps=3, accumulate_grad_batches=1
        )
        three.load_state_dict(saved)


def test_a_stop_request_ends_the_wait_for_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The learner waiting for a batch that never comes (every rollout hung) must still stop
    on SIGINT/SIGTERM: the stream polls the stop request between short waits."""
    import signal

    from frlab import stop
    from frlab.data import datamodule as dm

    class StuckPool:
        calls = 0

        def next_batch(self, timeout: float | None = None):
            StuckPool.calls += 1
            assert timeout is not None and timeout <= dm.POLL_S  # never an unbounded wait
            if StuckPool.calls == 3:
                stop.request_stop(signal.SIGTERM)
            raise TimeoutError("no batch")

        def stats(self) -> dict:
            return {}

    monkeypatch.setattr(dm, "POLL_S", 0.01)
    stream = iter(dm.PoolBatches(StuckPool(), pad_token_id=0, length=5))
    try:
        with pytest.raises(stop.RunInterrupted) as info:
            next(stream)
    finally:
        stop.clear()
    assert info.value.safe and StuckPool.calls == 3
