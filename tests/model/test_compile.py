"""`model.compile` (frlab.model.compile): compiled decoder layers give the uncompiled values,
the packed row is padded to a bucket without changing a log-prob, and compiles are counted."""

from __future__ import annotations

import pytest
import torch
from helpers.models import policy_of

from frlab.model.compile import BUCKET, CompileCounter, compile_layers, decoder_layers
from frlab.model.lm_logprobs import sequence_logprobs
from frlab.model.packed_attention import packed_attention
from frlab.model.policy import tiny_config

VOCAB = 96


def _model() -> torch.nn.Module:
    return policy_of(config=tiny_config("qwen2", vocab_size=VOCAB), seed=0).double()


def _batch(lengths: list[int], seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]
    ids = torch.where(mask, torch.randint(0, VOCAB, mask.shape, generator=gen), 0)
    return ids, mask


def _logprobs(model, ids, mask, bucket=None):
    model.zero_grad(set_to_none=True)
    with packed_attention(model):
        lp, _ = sequence_logprobs(model, ids, mask, pack=True, bucket=bucket)
        lp.sum().backward()
    return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("bucket", [7, BUCKET])
def test_a_bucket_pads_the_row_without_changing_a_log_prob_or_gradient(bucket: int) -> None:
    model = _model()
    ids, mask = _batch([5, 17, 9])  # 31 tokens: padded to 35 (bucket 7) or 256
    want = _logprobs(model, ids, mask)
    got = _logprobs(model, ids, mask, bucket=bucket)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-12)
    for name, grad in want[1].items():
        torch.testing.assert_close(got[1][name], grad, rtol=1e-12, atol=1e-12, msg=name)


@pytest.mark.slow  # torch.compile traces each layer
def test_compiled_layers_give_the_uncompiled_values_and_count_their_compiles() -> None:
    model, compiled = _model(), _model()
    counter = compile_layers(compiled, backend="eager")
    assert counter.compiles == 0  # compiled lazily, at the first call
    ids, mask = _batch([5, 17, 9])
    want = _logprobs(model, ids, mask, bucket=BUCKET)
    got = _logprobs(compiled, ids, mask, bucket=BUCKET)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-12)
    for name, grad in want[1].items():
        torch.testing.assert_close(got[1][name], grad, rtol=1e-10, atol=1e-12, msg=name)
    first = counter.compiles
    assert first > 0
    _logprobs(compiled, *_batch([5, 17, 9], seed=1), bucket=BUCKET)  # same shapes, new tokens
    assert counter.compiles == first  # nothing recompiled


def test_the_counter_hands_graphs_to_the_named_backend() -> None:
    counter = CompileCounter("eager")
    fn = torch.compile(lambda x: x.sin() + 1, backend=counter)
    x = torch.randn(4)
    torch.testing.assert_close(fn(x), x.sin() + 1)
    assert counter.compiles == 1
    fn(x)
    assert counter.compiles == 1


def test_a_model_without_a_layer_list_is_refused() -> None:
    model = _model()
    model.model.layers = torch.nn.ModuleList()
    with pytest.raises(ValueError, match="model.compile=true"):
        decoder_layers(model)
