"""Phase timers of a learner update (frlab.ops.phases): what a profiled update records, and
that nothing is recorded outside `profiling()`."""

from __future__ import annotations

import pytest
import torch
from helpers.models import policy_of

from frlab.model.lm_logprobs import sequence_logprobs
from frlab.model.packed_attention import packed_attention
from frlab.model.policy import tiny_config
from frlab.ops import phases
from frlab.ops.phases import phase, profiling, time_backward


def _update(model: torch.nn.Module) -> None:
    mask = torch.arange(12)[None] < torch.tensor([12, 7, 3])[:, None]
    ids = torch.where(mask, torch.randint(0, 64, mask.shape), 0)
    with packed_attention(model):
        lp, _ = sequence_logprobs(model, ids, mask, chunk_size=4, pack=True)
        with phase("backward"):
            lp.sum().backward()


def test_a_profiled_packed_update_records_every_model_phase() -> None:
    model = policy_of(config=tiny_config("qwen2", vocab_size=64), seed=0)
    with profiling("cpu") as tally:
        _update(model)
    layers = model.config.num_hidden_layers
    assert tally.calls == {
        "decoder_forward": 1,
        "attention_forward": layers,
        "attention_backward": layers,
        "lm_head_forward": 1,
        "lm_head_backward": 1,
        "backward": 1,
    }
    assert tally.seconds["decoder_forward"] >= tally.seconds["attention_forward"] > 0
    assert tally.seconds["backward"] >= tally.seconds["lm_head_backward"] > 0
    assert tally.seconds["backward"] >= tally.seconds["attention_backward"] > 0
    assert phases._ACTIVE is None


def test_nothing_is_recorded_outside_profiling_and_it_does_not_nest() -> None:
    model = policy_of(config=tiny_config("qwen2", vocab_size=64), seed=0)
    _update(model)  # no tally: must not fail or record
    with profiling("cpu") as tally:
        with pytest.raises(RuntimeError, match="already on"), profiling("cpu"):
            pass
    assert dict(tally.calls) == {}


def test_time_backward_spans_the_op_between_output_and_input() -> None:
    x = torch.randn(4, requires_grad=True)
    with profiling("cpu") as tally:
        y = x * 2
        z = y.exp()  # the op between y (input) and z (output)
        time_backward("exp_backward", z, (y,))
        z.sum().backward()
    assert tally.calls["exp_backward"] == 1 and tally.seconds["exp_backward"] >= 0
    assert "exp_backward" not in tally._open
