"""The chunked LM head equals the naive `F.linear(...).log_softmax` path, without [N, V].

Values and gradients (to hidden states, head weight and bias) agree within 1e-5 in float32;
what the head saves and allocates, and how much of it is alive at once, is recorded.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.memory import AllocationRecorder, LiveBytes
from helpers.saved_tensors import record_saved

from frlab.model import logprobs_from_hidden


def head_inputs(n=40, h=16, v=50, dtype=torch.float32, bias=True, seed=0):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=g, dtype=torch.float64) * 0.5).to(dtype).requires_grad_()
    b = (
        torch.randn(v, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
        if bias
        else None
    )
    targets = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, b, targets


def naive_head(hidden, weight, bias, targets, tau=1.0):  # type: ignore[no-untyped-def]
    logits = F.linear(hidden, weight, bias)
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    logq = (logits.to(dtype) / tau).log_softmax(-1)
    return logq.gather(1, targets[:, None]).squeeze(1), -(logq.exp() * logq).sum(-1)


@pytest.mark.parametrize("chunk_size", [1, 9, 40, 4096])
@pytest.mark.parametrize("tau", [1.0, 0.7])
@pytest.mark.parametrize("with_bias", [True, False])
def test_head_matches_naive(chunk_size: int, tau: float, with_bias: bool) -> None:
    hidden, weight, bias, y = head_inputs(bias=with_bias)
    logp, ent = logprobs_from_hidden(
        hidden, weight, y, bias=bias, temperature=tau, chunk_size=chunk_size, compute_entropy=True
    )
    ref_logp, ref_ent = naive_head(hidden, weight, bias, y, tau)
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)
    assert not ent.requires_grad
    leaves = [t for t in (hidden, weight, bias) if t is not None]
    coef = torch.randn(hidden.shape[0])
    grads = torch.autograd.grad((coef * logp).sum(), leaves)
    ref_grads = torch.autograd.grad((coef * ref_logp).sum(), leaves)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_head_gradcheck_float64() -> None:
    hidden, weight, bias, y = head_inputs(n=7, h=4, v=6, dtype=torch.float64)

    def f(h, w, b):  # type: ignore[no-untyped-def]
        return logprobs_from_hidden(h, w, y, bias=b, temperature=0.9, chunk_size=3)[0]

    assert f(hidden, weight, bias).dtype == torch.float64
    assert torch.autograd.gradcheck(f, (hidden, weight, bias))


def test_head_saves_and_allocates_nothing_of_size_n_times_v() -> None:
    n, h, v, chunk = 256, 16, 200, 32
    hidden, weight, bias, y = head_inputs(n=n, h=h, v=v)
    rec = AllocationRecorder()
    with rec:
        (logp, _), saved = record_saved(
            lambda: logprobs_from_hidden(hidden, weight, y, bias=bias, chunk_size=chunk)
        )
        logp.sum().backward()
    assert max(saved) < n * v
    assert max(numel for _, _, numel in rec.allocs) <= chunk * v
    # the checks can fail: the naive head saves and allocates [N, V]
    rec.allocs.clear()
    with rec:
        _, naive_saved = record_saved(lambda: naive_head(hidden, weight, bias, y))
    assert max(naive_saved) >= n * v
    assert max(numel for _, _, numel in rec.allocs) >= n * v


def test_head_under_cpu_autocast_matches_autocast_linear() -> None:
    """Under bf16 autocast the head matmul runs in bf16 like the model's own nn.Linear."""
    hidden, weight, bias, y = head_inputs(n=24, h=32, v=64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, _ = logprobs_from_hidden(hidden, weight, y, bias=bias, chunk_size=24)
        ref_logp, _ = naive_head(hidden, weight, bias, y)
    assert logp.dtype == torch.float32
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=0)
    grads = torch.autograd.grad(logp.sum(), (hidden, weight, bias))
    ref_grads = torch.autograd.grad(ref_logp.sum(), (hidden, weight, bias))
    for got, want in zip(grads, ref_grads, strict=True):
        assert got.dtype == want.dtype == torch.float32
        torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)
    # autocast really changed the matmul: the plain float32 head gives other values
    assert not torch.allclose(logp, naive_head(hidden, weight, bias, y)[0], atol=1e-5)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"hidden": torch.zeros(3)}, "hidden"),
        ({"hidden": torch.zeros(3, 4, dtype=torch.long)}, "hidden"),
        ({"weight": torch.zeros(5, 3)}, "weight"),
        ({"weight": torch.zeros(5)}, "weight"),
        ({"bias": torch.zeros(4)}, "bias"),
        ({"targets": torch.tensor([0, 1])}, "targets"),
        ({"targets": torch.tensor([0, 1, 5])}, "targets"),
        ({"temperature": 0.0}, "temperature"),
        ({"chunk_size": -3}, "chunk_size"),
    ],
)
def test_head_validation(change: dict, field: str) -> None:
    args = {
        "hidden": torch.zeros(3, 4),
        "weight": torch.zeros(5, 4),
        "targets": torch.tensor([0, 1, 4]),
        "bias": None,
    }
    args.update(change)
    with pytest.raises(ValueError, match=field):
        logprobs_from_hidden(args.pop("hidden"), args.pop("weight"), args.pop("targets"), **args)


@pytest.mark.parametrize(
    ("dtype", "chunks"),
    [(torch.float32, 1.0), (torch.bfloat16, 1.5)],  # bf16 on a CPU: product + float32 copy
)
def test_head_forward_holds_one_chunk_at_a_time(dtype: torch.dtype, chunks: float) -> None:
    """One float32 chunk of logits alive at a time (1.5 where the low-precision product sits
    beside its float32 copy): each chunk is freed before the next is made."""
    n, h, v, chunk = 96, 16, 2048, 16
    hidden, weight, bias, y = head_inputs(n=n, h=h, v=v, dtype=dtype)
    recorder = LiveBytes()
    with recorder:
        logprobs_from_hidden(hidden, weight, y, bias=bias, chunk_size=chunk)
    one_chunk = chunk * v * 4
    assert chunks * one_chunk <= recorder.peak <= chunks * one_chunk + 64 * n * 4


def test_head_backward_holds_one_chunk_beside_the_gradients() -> None:
    n, h, v, chunk = 96, 16, 2048, 16
    hidden, weight, bias, y = head_inputs(n=n, h=h, v=v)
    logp, _ = logprobs_from_hidden(hidden, weight, y, bias=bias, chunk_size=chunk)
    recorder = LiveBytes()
    with recorder:
        torch.autograd.grad(logp.sum(), (hidden, weight, bias))
    gradients = (n * h + v * h + v) * 4
    one_chunk = chunk * v * 4
    assert gradients + one_chunk <= recorder.peak <= gradients + one_chunk + 64 * n * 4


def test_float32_products_only_where_checked() -> None:
    """A CPU (no `aten::mm.dtype` kernel) and full-precision operands take the plain path."""
    from frlab.model.lm_head import fp32_products

    cpu = torch.device("cpu")
    assert not fp32_products(cpu, torch.bfloat16)
    assert not fp32_products(cpu, torch.float32)
    if torch.cuda.is_available():
        assert not fp32_products(torch.device("cuda"), torch.float32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bf16_head_products_in_float32_one_chunk_alive() -> None:
    """On CUDA with bf16 operands the head multiplies straight into float32: values and
    gradients match the float32 reference of the same bf16 operands, and the forward's peak
    extra memory is one float32 chunk (plus allocator slack)."""
    from frlab.model.lm_head import fp32_products
    from frlab.ops.logprobs import rows_per_chunk

    dev = torch.device("cuda")
    n, h, v = 4096, 1536, 151_936
    hidden, weight, _, y = head_inputs(n=n, h=h, v=v, dtype=torch.bfloat16, bias=False)
    hidden, weight, y = (t.detach().to(dev) for t in (hidden, weight, y))
    hidden.requires_grad_()
    weight.requires_grad_()
    assert fp32_products(dev, torch.bfloat16), "this torch has no float32-output bf16 matmul"
    rows = rows_per_chunk(1024, v, dev)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    logp, _ = logprobs_from_hidden(hidden, weight, y, chunk_size=1024)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert extra <= 1.05 * rows * v * 4 + (16 << 20), (extra, rows)
    ref = (hidden.float() @ weight.float().t()).log_softmax(-1).gather(1, y[:, None])[:, 0]
    torch.testing.assert_close(logp, ref, atol=2e-3, rtol=0)
    g_hidden, g_weight = torch.autograd.grad(logp.sum(), (hidden, weight))
    r_hidden, r_weight = torch.autograd.grad(ref.sum(), (hidden, weight))
    torch.testing.assert_close(g_hidden.float(), r_hidden.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(g_weight.float(), r_weight.float(), atol=2e-2, rtol=2e-2)
