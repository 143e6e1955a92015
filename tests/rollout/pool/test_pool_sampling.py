"""The pool's off-policy sampling guard (FlashREINFORCE paper, Sec. 3): importance ratios need the
full support of
the sampling distribution, so a pool built directly (benches, scripts, not only train.py)
refuses top_p < 1 or top_k > 0 unless the objective makes no off-policy correction (no_is)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers.pool import pool_settings

from envs.toy import ParityTasks
from frlab.defaults import agent_loop_config, sampling_params
from frlab.model.toy_tokenizer import build_toy_tokenizer
from frlab.objective import Objective
from frlab.rollout.engine import SamplingParams
from frlab.rollout.pool import RolloutPool

TOKENIZER = build_toy_tokenizer()


def build_pool(sampling: SamplingParams, **kw) -> RolloutPool:
    cfg = agent_loop_config(max_turns=1, max_len=32, sampling=sampling)
    engine = SimpleNamespace(version=0)  # the constructor never calls the engine
    return RolloutPool(
        engine,
        dict,
        TOKENIZER,
        cfg,
        task_sampler=ParityTasks(),
        batch_size=2,
        max_in_flight=4,
        **pool_settings(max_policy_lag=2, **kw),
    )


@pytest.mark.parametrize(
    ("sampling", "key"),
    [
        (sampling_params(top_p=0.9), "rollout.sampling.top_p"),
        (sampling_params(top_k=5), "rollout.sampling.top_k"),
    ],
)
def test_truncated_sampling_is_refused_with_off_policy_correction(sampling, key) -> None:
    with pytest.raises(ValueError, match=key):
        build_pool(sampling)  # the default: off_policy_correction=True
    uses_is = Objective.from_config({}).uses_off_policy_correction
    assert uses_is
    with pytest.raises(ValueError, match=key):
        build_pool(sampling, off_policy_correction=uses_is)


def test_no_is_accepts_truncated_sampling() -> None:
    no_is = Objective.from_config({"trust_region": "no_is"}).uses_off_policy_correction
    assert no_is is False
    pool = build_pool(sampling_params(top_p=0.9, top_k=5), off_policy_correction=no_is)
    assert pool.loop_cfg.sampling.top_p == 0.9 and pool.loop_cfg.sampling.top_k == 5


def test_full_support_and_invalid_values_are_checked_either_way() -> None:
    build_pool(sampling_params(top_p=1.0, top_k=0), off_policy_correction=True)
    with pytest.raises(ValueError, match="rollout.sampling.temperature"):
        build_pool(sampling_params(temperature=0.0), off_policy_correction=False)
    with pytest.raises(ValueError, match="rollout.sampling.top_p"):
        build_pool(sampling_params(top_p=1.5), off_policy_correction=False)
