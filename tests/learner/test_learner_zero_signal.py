"""`optim.skip_zero_signal_steps`: what a batch with an exactly zero gradient does.

Off (the default, as the reference): AdamW steps anyway, so weight decay and the moments move
the weights; the update equals a hand-made AdamW step with zero gradients. On: parameters and
AdamW state stay exactly as they are and the work that cannot matter is skipped (no forward
when every advantage is 0, no backward for micro-batches none of whose rows contributes). Both
ways the step counts (version, global step, schedule) and `train/zero_signal_step` says it.
"""

from __future__ import annotations

import copy
import dataclasses
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
    flat_rewards,
    loader,
    make_batch,
    max_abs_diff,
    reference_update,
    rejected,
    snapshot,
    tiny_policy,
    trainer,
)
from lightning.pytorch.callbacks import Callback

from frlab.learner import FlashReinforceModule
from frlab.learner import metrics as M

B = 8


class _Record(Callback):
    """Parameters and a deep copy of the optimizer state after every batch."""

    def __init__(self) -> None:
        self.params: list[dict[str, torch.Tensor]] = []
        self.optim: list[dict] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.params.append(snapshot(pl_module.policy))
        self.optim.append(copy.deepcopy(trainer.optimizers[0].state_dict()))


class _Counting(FlashReinforceModule):
    """Counts decoder forwards and backward passes."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.forwards = 0
        self.backwards = 0
        self.policy.model.register_forward_pre_hook(lambda *_: self._count_forward())

    def _count_forward(self) -> None:
        self.forwards += 1

    def manual_backward(self, loss, *args, **kwargs) -> None:
        self.backwards += 1
        super().manual_backward(loss, *args, **kwargs)


def _fit(policy, batches, *, skip: bool, micro: int = 4, objective=None):
    optim = {**OPTIM_CFG, "skip_zero_signal_steps": skip}
    built = learner_module(
        MODEL_CFG,
        objective or OBJECTIVE_CFG,
        optim,
        batch_size=B,
        micro_batch_size=micro,
        policy=policy,
    )
    module = _Counting(built.policy, built.objective, built.optimizer_factory, built.settings)
    record, logger = _Record(), MemoryLogger()
    fitted = trainer(len(batches), callbacks=[record], logger=logger)
    fitted.fit(module, loader(batches))
    assert module.policy_version == len(batches) == fitted.global_step
    return module, record, [row for _, row in logger.rows]


def _flat(policy, seed: int):
    return flat_rewards(make_batch(policy, rows=B, seed=seed))


def _adam_state_equal(a: dict, b: dict) -> bool:
    sa, sb = a["state"], b["state"]
    return sa.keys() == sb.keys() and all(
        torch.equal(sa[k][name], sb[k][name]) for k in sa for name in sa[k]
    )


def test_on_all_advantages_zero_skips_forward_backward_and_the_adamw_update() -> None:
    policy = tiny_policy(seed=7)
    learning = make_batch(policy, rows=B, seed=12)
    module, record, rows = _fit(policy, [learning, _flat(policy, 13), learning], skip=True)
    assert max_abs_diff(record.params[1], record.params[0]) == 0.0
    assert _adam_state_equal(record.optim[1], record.optim[0])
    assert max_abs_diff(record.params[2], record.params[1]) > 0  # signal moves it again
    assert module.forwards == 2 * 2 and module.backwards == 2 * 2  # 2 micro-batches, 2 batches
    assert [row[M.ZERO_SIGNAL] for row in rows] == [0.0, 1.0, 0.0]
    assert [row[M.MICRO_BATCHES] for row in rows] == [2.0, 0.0, 2.0]
    assert math.isnan(rows[1][M.ACCEPTANCE]) and rows[1][M.REWARD] == 1.0  # no forward ran


def _adamw_step_with_zero_grads(params: dict, state: dict) -> dict[str, torch.Tensor]:
    """The reference: AdamW from the given parameters and state, every gradient 0."""
    fresh = tiny_policy(seed=0)
    fresh.load_state_dict(params)
    named = list(fresh.named_parameters())
    optimizer = torch.optim.AdamW(
        [p for _, p in named],
        lr=OPTIM_CFG["lr"],
        weight_decay=OPTIM_CFG["weight_decay"],
        betas=tuple(OPTIM_CFG["betas"]),
        eps=OPTIM_CFG["eps"],
    )
    optimizer.load_state_dict(state)
    for _, p in named:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    return snapshot(fresh)


def test_off_all_advantages_zero_steps_adamw_as_the_reference() -> None:
    policy = tiny_policy(seed=7)
    learning = make_batch(policy, rows=B, seed=12)
    module, record, rows = _fit(policy, [learning, _flat(policy, 13)], skip=False)
    assert max_abs_diff(record.params[1], record.params[0]) > 1e-4  # decay + moments moved it
    want = _adamw_step_with_zero_grads(record.params[0], record.optim[0])
    assert max_abs_diff(record.params[1], want) < 1e-12
    steps = {int(s["step"]) for s in record.optim[1]["state"].values()}
    assert steps == {2}
    assert [row[M.ZERO_SIGNAL] for row in rows] == [0.0, 1.0]
    assert rows[1][M.GRAD_NORM] == 0.0 and rows[1][M.LOSS] == 0.0


@pytest.mark.parametrize("case", ["every_row_rejected", "every_token_filtered"])
@pytest.mark.parametrize("skip", [True, False], ids=["on", "off"])
def test_zero_gradient_after_the_forward(case: str, skip: bool) -> None:
    policy = tiny_policy(seed=8)
    learning = make_batch(policy, rows=B, seed=14)
    dead = make_batch(policy, rows=B, seed=15)
    objective = OBJECTIVE_CFG
    if case == "every_row_rejected":
        dead = rejected(dead)
    else:  # q = 0 keeps no token of a failed row: every row of `dead` failed, none of `learning`
        dead = dataclasses.replace(dead, failures=torch.ones(B, dtype=torch.bool))
        learning = dataclasses.replace(learning, failures=torch.zeros(B, dtype=torch.bool))
        objective = {
            **OBJECTIVE_CFG,
            "token_filter": "entropy_failures",
            "entropy_failures": {"q": 0.0},
        }
    assert bool((dead.rewards != dead.rewards.mean()).any())  # advantages are not all 0
    module, record, rows = _fit(policy, [learning, dead], skip=skip, objective=objective)
    assert module.forwards == 4  # the forward is needed to know
    assert rows[1][M.ZERO_SIGNAL] == 1.0 and rows[1][M.GRAD_NORM] == 0.0
    if case == "every_row_rejected":
        assert rows[1][M.ACCEPTANCE] == 0.0
    else:
        assert rows[1][M.RETAINED_FRAC] == 0.0 and rows[1][M.ACCEPTANCE] > 0
    if skip:
        assert module.backwards == 2  # the dead batch's 2 micro-batches skipped backward
        assert max_abs_diff(record.params[1], record.params[0]) == 0.0
        assert _adam_state_equal(record.optim[1], record.optim[0])
    else:
        assert module.backwards == 4
        want = _adamw_step_with_zero_grads(record.params[0], record.optim[0])
        assert max_abs_diff(record.params[1], want) < 1e-12
        assert max_abs_diff(record.params[1], record.params[0]) > 1e-4


@pytest.mark.slow
def test_on_skips_only_dead_micro_batches_and_gives_the_same_update() -> None:
    """Rows 0-1 rejected (and rows 2-3 by the batch's own noise): those micro-batches of 2
    skip their backward, and the update is bit-for-bit the one with the option off."""
    base = tiny_policy(seed=9)
    batch = rejected(make_batch(base, rows=B, seed=16), slice(0, 2))
    admitted = reference_update(copy.deepcopy(base), batch, delta=DELTA, **OPTIM_CFG)["admitted"]
    advantages = batch.rewards - batch.rewards.mean()
    live = (admitted & (advantages != 0)).view(4, 2).any(dim=1)
    assert not bool(live[0]) and bool(live.any())
    on, record_on, rows_on = _fit(copy.deepcopy(base), [batch], skip=True, micro=2)
    off, record_off, rows_off = _fit(copy.deepcopy(base), [batch], skip=False, micro=2)
    assert off.backwards == 4 and on.backwards == int(live.sum())
    assert max_abs_diff(record_on.params[0], record_off.params[0]) == 0.0
    assert max_abs_diff(record_on.params[0], snapshot(base)) > 1e-3
    assert rows_on[0][M.ZERO_SIGNAL] == rows_off[0][M.ZERO_SIGNAL] == 0.0
    assert rows_on[0][M.GRAD_NORM] == rows_off[0][M.GRAD_NORM]
