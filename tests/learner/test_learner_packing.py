"""Token-budget micro-batches and packed rows give the update of one padded full batch.

Float64 tiny Qwen2. Each layout (packed or padded, with or without a token budget) must give
the same parameters, loss and pre-clip gradient norm as the hand-written loop and as one padded
micro-batch of the whole batch, for every aggregation (the losses are normalised by the global
B or token count, so micro-batch losses sum to the full-batch loss). Logged values pass
through Lightning's float32 logging, hence their relative tolerance of 1e-6.
"""

from __future__ import annotations

import copy
import dataclasses

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

from frlab.learner import metrics as M
from frlab.learner.micro_batches import MicroBatching, micro_batch_plan
from frlab.objective import AGGREGATIONS

B = 8
WIDTH = 24  # rows of 3 to 17 tokens


def _fit(policy, *, micro: int, budget: int | None, pack: bool, objective=None):
    module = learner_module(
        MODEL_CFG,
        objective or OBJECTIVE_CFG,
        OPTIM_CFG,
        batch_size=B,
        micro_batch_size=micro,
        max_tokens_per_micro_batch=budget,
        pack_sequences=pack,
        policy=policy,
    )
    logger = MemoryLogger()
    return module, logger


def _update(base, batch, **layout):
    module, logger = _fit(copy.deepcopy(base), **layout)
    trainer(1, logger=logger).fit(module, loader([batch]))
    return snapshot(module.policy), logger.rows[-1][1]


LAYOUTS = {
    "packed_budget": {"micro": B, "budget": 24, "pack": True},
    "packed_rows": {"micro": 3, "budget": None, "pack": True},
    "padded_budget": {"micro": B, "budget": 40, "pack": False},
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layouts_match_the_hand_written_loop(layout: str) -> None:
    base = tiny_policy(seed=0)
    batch = make_batch(base, rows=B, seed=1, width=WIDTH)
    lengths = batch.attention_mask.sum(1)
    assert lengths.max() > 2 * lengths.min()  # ragged
    params, row = _update(base, batch, **LAYOUTS[layout])
    if LAYOUTS[layout]["budget"] is not None:
        assert row[M.MICRO_BATCHES] >= 3  # the budget really split the batch
    reference = copy.deepcopy(base)
    ref = reference_update(reference, batch, delta=DELTA, **OPTIM_CFG)
    assert 0 < int(ref["admitted"].sum()) < B
    assert max_abs_diff(params, snapshot(base)) > 1e-3
    assert max_abs_diff(params, snapshot(reference)) < 1e-6
    assert row[M.LOSS] == pytest.approx(float(ref["loss"]), rel=1e-6, abs=1e-12)
    assert row[M.GRAD_NORM] == pytest.approx(float(ref["grad_norm"]), rel=1e-6)
    assert row[M.ACCEPTANCE] == pytest.approx(float(ref["admitted"].double().mean()))


# Settings of some aggregations' runs; every registered aggregation runs (with its declared
# defaults where it is not listed here).
AGGREGATION_SETTINGS = {
    "sample_mean": {"token_filter": "entropy_failures", "entropy_failures": {"q": 0.5}},
    "constant_length": {"constant_length": {"length": 12}},
}


@pytest.mark.slow
@pytest.mark.parametrize("aggregation", AGGREGATIONS.names())
def test_every_aggregation_is_layout_invariant(aggregation: str) -> None:
    base = tiny_policy(seed=2)
    batch = make_batch(base, rows=B, seed=5, width=WIDTH)
    objective = {
        **OBJECTIVE_CFG,
        "aggregation": aggregation,
        **AGGREGATION_SETTINGS.get(aggregation, {}),
    }
    full_params, full = _update(base, batch, micro=B, budget=None, pack=False, objective=objective)
    assert full[M.MICRO_BATCHES] == 1
    assert max_abs_diff(full_params, snapshot(base)) > 1e-3
    for layout in LAYOUTS.values():
        params, row = _update(base, batch, **layout, objective=objective)
        assert max_abs_diff(params, full_params) < 1e-6
        for key in (M.LOSS, M.GRAD_NORM, M.ACCEPTANCE, M.RETAINED_FRAC, M.SEQUENCE_KL):
            assert row[key] == pytest.approx(full[key], rel=1e-6, abs=1e-12), key


def test_logged_micro_batch_count_is_the_plans() -> None:
    base = tiny_policy(seed=3)
    batch = make_batch(base, rows=B, seed=7, width=WIDTH)
    how = MicroBatching(max_rows=B, max_tokens=20, pack=True)
    expected = len(micro_batch_plan(batch, how))
    _, row = _update(base, batch, micro=B, budget=20, pack=True)
    assert row[M.MICRO_BATCHES] == expected > 1


def test_packing_with_an_unsupported_attention_is_refused() -> None:
    policy = tiny_policy()
    policy.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match=r"data\.pack_sequences=false"):
        learner_module(
            MODEL_CFG, OBJECTIVE_CFG, OPTIM_CFG, batch_size=B, micro_batch_size=B, policy=policy
        )
    module = learner_module(
        MODEL_CFG,
        OBJECTIVE_CFG,
        OPTIM_CFG,
        batch_size=B,
        micro_batch_size=B,
        pack_sequences=False,
        policy=policy,
    )
    assert module.micro.pack is False
    assert torch.is_tensor(next(module.policy.parameters()))


@pytest.mark.slow  # torch.compile traces each layer
def test_compiled_learner_matches_the_uncompiled_update_and_logs_its_compiles() -> None:
    """model.compile=true (a CPU backend here): the same parameters and loss as the plain packed
    update, and `train/compiles` logged; with routing replay it is refused naming both keys."""
    base = tiny_policy(seed=0)
    batch = make_batch(base, rows=B, seed=1, width=WIDTH)
    want_params, want_row = _update(base, batch, **LAYOUTS["packed_budget"])
    module, logger = _fit(copy.deepcopy(base), **LAYOUTS["packed_budget"])
    module.settings = dataclasses.replace(module.settings, compile=True)
    module.compile_backend = "eager"
    trainer(1, logger=logger).fit(module, loader([batch]))
    row = logger.rows[-1][1]
    assert max_abs_diff(snapshot(module.policy), want_params) < 1e-12
    assert row[M.LOSS] == pytest.approx(want_row[M.LOSS], rel=1e-6)
    assert row[M.COMPILES] >= 1
    assert M.COMPILES not in want_row
