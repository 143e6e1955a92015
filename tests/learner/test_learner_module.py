"""FlashReinforceModule: one exact update per batch on a tiny random-init Qwen2.

Parity tests run the policy in float64, where the module (chunked LM-head log-probs, objective,
micro-batching) and the hand-written loop (full logits) agree to ~1e-12; the tolerance is 1e-6.
AdamW is nearly invariant to a global gradient scale, so the tests also compare the logged
pre-clip gradient norm and loss, which a normalisation bug would change.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from helpers.learner import learner_module
from helpers.learner_setup import (
    DELTA,
    MODEL_CFG,
    OBJECTIVE_CFG,
    OPTIM_CFG,
    MemoryLogger,
    loader,
    make_batch,
    max_abs_diff,
    reference_update,
    snapshot,
    tiny_policy,
    trainer,
)
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins import MixedPrecision

from frlab.learner import FlashReinforceModule
from frlab.learner import metrics as M

B = 8


def _module(
    policy=None, *, micro: int = B, objective=None, optim=None, **kw
) -> FlashReinforceModule:
    return learner_module(
        MODEL_CFG,
        objective or OBJECTIVE_CFG,
        optim or OPTIM_CFG,
        batch_size=kw.pop("batch_size", B),
        micro_batch_size=micro,
        policy=policy,
        **kw,
    )


def _fit(module: FlashReinforceModule, batches, **trainer_kw) -> MemoryLogger:
    logger = MemoryLogger()
    trainer(len(batches), logger=logger, **trainer_kw).fit(module, loader(batches))
    return logger


@pytest.mark.slow
@pytest.mark.parametrize(
    ("temperature", "q"), [(1.0, 1.0), (0.7, 0.5)], ids=["base", "temp0.7_entropy_q0.5"]
)
def test_step_matches_hand_written_loop(temperature: float, q: float) -> None:
    policy = tiny_policy(seed=0)
    reference = copy.deepcopy(policy)
    batch = make_batch(policy, rows=B, seed=1, temperature=temperature)
    before = snapshot(policy)
    objective = {**OBJECTIVE_CFG, "token_filter": "entropy_failures", "entropy_failures": {"q": q}}
    module = _module(policy, micro=3, objective=objective, temperature=temperature)
    logger = _fit(module, [batch])

    ref = reference_update(reference, batch, delta=DELTA, temperature=temperature, q=q, **OPTIM_CFG)
    # The batch exercises the gate (some rows rejected) and clipping (norm above the clip).
    assert 0 < int(ref["admitted"].sum()) < B
    assert float(ref["grad_norm"]) > OPTIM_CFG["grad_clip"]
    if q < 1:
        assert float(ref["retained_frac"]) < float(ref["admitted"].double().mean())
    after = snapshot(module.policy)
    assert max_abs_diff(after, before) > 1e-3  # the step really moved the weights
    assert max_abs_diff(after, snapshot(reference)) < 1e-6
    _, logged = logger.rows[-1]
    assert logged[M.GRAD_NORM] == pytest.approx(float(ref["grad_norm"]), rel=1e-6)
    assert logged[M.LOSS] == pytest.approx(float(ref["loss"]), rel=1e-6, abs=1e-12)
    assert logged[M.ACCEPTANCE] == pytest.approx(float(ref["admitted"].double().mean()))
    assert logged[M.RETAINED_FRAC] == pytest.approx(float(ref["retained_frac"]), rel=1e-6)


@pytest.mark.slow
def test_micro_batch_count_does_not_change_the_update() -> None:
    base = tiny_policy(seed=2)
    batches = [make_batch(base, rows=B, seed=s) for s in (3, 4)]
    optim = {**OPTIM_CFG, "scheduler": "cosine", "warmup_ratio": 0.5, "min_lr_ratio": 0.1}
    results = {}
    for micro in (8, 4, 2):  # 1, 2 and 4 micro-batches
        module = _module(copy.deepcopy(base), micro=micro, optim=optim)
        logger = _fit(module, batches)
        results[micro] = (snapshot(module.policy), [row for _, row in logger.rows])
    params, rows = results[8]
    assert max_abs_diff(params, snapshot(base)) > 1e-3
    for micro in (4, 2):
        other_params, other_rows = results[micro]
        assert max_abs_diff(params, other_params) < 1e-6
        for a, b in zip(rows, other_rows, strict=True):
            for key in (M.LOSS, M.GRAD_NORM, M.ACCEPTANCE, M.SEQUENCE_KL, M.LR):
                assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-12)


class _CountSteps(Callback):
    def __init__(self) -> None:
        self.calls = 0

    def on_train_start(self, trainer, pl_module) -> None:
        trainer.optimizers[0].register_step_post_hook(lambda *_: self._count())

    def _count(self) -> None:
        self.calls += 1


@pytest.mark.slow
def test_exactly_one_optimizer_step_per_batch() -> None:
    policy = tiny_policy(seed=3)
    batches = [make_batch(policy, rows=B, seed=s) for s in (5, 6, 7)]
    module = _module(policy, micro=2)  # 4 micro-batches per batch
    counter = _CountSteps()
    fit_trainer = trainer(len(batches), callbacks=[counter])
    fit_trainer.fit(module, loader(batches))
    assert counter.calls == 3
    assert fit_trainer.global_step == 3
    assert module.policy_version == 3
    assert fit_trainer.lr_scheduler_configs[0].scheduler.last_epoch == 3


def _expected_lag(batch, version: int) -> torch.Tensor:
    oldest = [
        min(v for v, a in zip(vs.tolist(), am.tolist(), strict=True) if a)
        for vs, am in zip(batch.token_versions, batch.action_mask, strict=True)
    ]
    return version - torch.tensor(oldest, dtype=torch.float64)


@pytest.mark.slow
def test_metric_names_and_values() -> None:
    policy = tiny_policy(seed=4)
    batches = [make_batch(policy, rows=B, seed=s, max_version=4) for s in (8, 9)]
    module = _module(policy, micro=4)
    module.policy_version = 6
    logger = _fit(module, batches)
    expected_names = {
        M.REWARD,
        M.ACCEPTANCE,
        M.SEQUENCE_KL,
        M.LAG_MEAN,
        M.LAG_MAX,
        M.RESPONSE_TOKENS,
        M.LOSS,
        M.GRAD_NORM,
        M.LR,
        M.ADVANTAGE_ABS,
        M.RETAINED_FRAC,
        M.STEP_S,
        M.LOGPROB_S,
        M.BACKWARD_S,
    }
    assert [step for step, _ in logger.rows] == [0, 1]
    for (_, row), batch, version in zip(logger.rows, batches, (6, 7), strict=True):
        assert expected_names <= set(row)
        rewards = batch.rewards.double()
        lag = _expected_lag(batch, version)
        assert row[M.REWARD] == pytest.approx(float(rewards.mean()))
        assert row[M.ADVANTAGE_ABS] == pytest.approx(float((rewards - rewards.mean()).abs().mean()))
        assert row[M.LAG_MEAN] == pytest.approx(float(lag.mean()))
        assert row[M.LAG_MAX] == float(lag.max())
        assert row[M.RESPONSE_TOKENS] == pytest.approx(
            float(batch.action_mask.sum(1).double().mean())
        )
        assert row[M.LR] == pytest.approx(OPTIM_CFG["lr"])
        assert 0 < row[M.ACCEPTANCE] < 1
        assert row[M.SEQUENCE_KL] > 0
        assert row[M.STEP_S] >= row[M.LOGPROB_S] + row[M.BACKWARD_S] > 0
    assert module.policy_version == 8


@pytest.mark.slow
def test_turns_and_tool_calls_are_logged_from_trajectory_info() -> None:
    """Multi-turn tool use: turns and tool calls per trajectory reach the logged row; a batch
    without agent-loop info (hand-built) logs neither."""
    import dataclasses

    policy = tiny_policy(seed=6)
    batch = make_batch(policy, rows=B, seed=11)
    tool_calls = [k % 3 for k in range(B)]
    infos = [{"turns": c + 1, "tool_calls": c} for c in tool_calls]
    with_info = dataclasses.replace(batch, infos=infos)
    logger = _fit(_module(policy, micro=4), [batch, with_info])
    (_, first), (_, second) = logger.rows
    assert M.TOOL_CALLS not in first and M.TURNS not in first
    assert second[M.TOOL_CALLS] == pytest.approx(sum(tool_calls) / B)
    assert second[M.TURNS] == pytest.approx(sum(tool_calls) / B + 1)


def test_progress_bar_shows_reward_acceptance_and_lag() -> None:
    policy = tiny_policy(seed=5)
    module = _module(policy)
    fit_trainer = trainer(1)
    fit_trainer.fit(module, loader([make_batch(policy, rows=B, seed=10)]))
    assert {M.REWARD, M.ACCEPTANCE, M.LAG_MEAN} <= set(fit_trainer.progress_bar_metrics)
    assert M.SEQUENCE_KL not in fit_trainer.progress_bar_metrics


def test_batch_of_wrong_size_names_the_field() -> None:
    policy = tiny_policy(seed=6)
    module = _module(policy)
    with pytest.raises(ValueError, match="data.batch_size"):
        trainer(1).fit(module, loader([make_batch(policy, rows=B - 2, seed=11)]))


def test_a_batch_that_does_not_split_over_the_ranks_is_refused() -> None:
    """B = 5 over 2 ranks: 2 rows a rank would sum to 4, not the B of the normalisation."""
    policy = tiny_policy(seed=6)
    module = _module(policy, micro=1, batch_size=5)
    with pytest.raises(ValueError, match="must be divisible by the number of ranks"):
        module._check_batch(make_batch(policy, rows=2, seed=11), world=2)


def test_routing_replay_is_refused_for_a_dense_policy() -> None:
    with pytest.raises(ValueError, match="routing_replay.*MoE"):
        learner_module(
            {**MODEL_CFG, "routing_replay": True},
            OBJECTIVE_CFG,
            OPTIM_CFG,
            batch_size=B,
            micro_batch_size=B,
        )


def test_builds_policy_from_model_config() -> None:
    module = learner_module(
        {**MODEL_CFG, "seed": 0}, OBJECTIVE_CFG, OPTIM_CFG, batch_size=B, micro_batch_size=B
    )
    assert module.policy.config.vocab_size == MODEL_CFG["config"]["vocab_size"]
    assert module.objective.names["trust_region"] == "sequence_bernoulli_kl"
    assert module.policy_version == 0
    assert module.hparams["learner"]["micro_batch_size"] == B


@pytest.mark.slow
def test_gradient_checkpointing_gives_the_same_update() -> None:
    results = []
    for checkpointing in (False, True):
        cfg = {**MODEL_CFG, "seed": 0, "gradient_checkpointing": checkpointing}
        module = learner_module(cfg, OBJECTIVE_CFG, OPTIM_CFG, batch_size=B, micro_batch_size=4)
        assert module.policy.is_activation_checkpointing is checkpointing
        batch = make_batch(module.policy, rows=B, seed=12)
        _fit(module, [batch])
        results.append(snapshot(module.policy))
    assert max_abs_diff(results[0], results[1]) < 1e-6


@pytest.mark.parametrize("route", ["trainer_bf16_mixed", "model_dtype_bfloat16"])
def test_bf16_options_run_and_update(route: str) -> None:
    if route == "model_dtype_bfloat16":
        module = learner_module(
            {**MODEL_CFG, "seed": 0, "dtype": "bfloat16"},
            OBJECTIVE_CFG,
            OPTIM_CFG,
            batch_size=B,
            micro_batch_size=4,
        )
        trainer_kw = {}
        assert next(module.policy.parameters()).dtype == torch.bfloat16
    else:
        module = _module(tiny_policy(seed=7, dtype=torch.float32), micro=4)
        trainer_kw = {"precision": "bf16-mixed"}
    batch = make_batch(module.policy, rows=B, seed=13)
    before = snapshot(module.policy)
    logger = _fit(module, [batch], **trainer_kw)
    _, row = logger.rows[-1]
    assert math.isfinite(row[M.LOSS]) and math.isfinite(row[M.GRAD_NORM]) and row[M.GRAD_NORM] > 0
    assert max_abs_diff(snapshot(module.policy), before) > 1e-4


def test_fp16_loss_scaling_is_refused() -> None:
    module = _module(tiny_policy(seed=8, dtype=torch.float32))
    batch = make_batch(module.policy, rows=B, seed=14)
    # Lightning maps 16-mixed to bf16 on CPU, so give it an fp16 plugin with a loss scaler.
    fp16 = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    with pytest.raises(ValueError, match="16-mixed"):
        trainer(1, plugins=[fp16]).fit(module, loader([batch]))


def test_model_keys_the_learner_reads_default_to_the_declared_values() -> None:
    """`model.logprob_chunk_size` and `model.routing_replay` left out of the mapping: the
    learner uses the schema's defaults (a Python caller trains as the command line does)."""
    from frlab.config.schema import ModelConfig

    model = {
        k: v for k, v in MODEL_CFG.items() if k not in ("logprob_chunk_size", "routing_replay")
    }
    module = learner_module(model, OBJECTIVE_CFG, OPTIM_CFG, batch_size=B, micro_batch_size=B)
    declared = ModelConfig()
    assert module.settings.logprob_chunk_size == declared.logprob_chunk_size
    assert module.settings.routing_replay == declared.routing_replay
