"""Chunked sampled-token log-probs and entropies equal the naive log_softmax path.

Naive reference: `z = logits.float() / tau; logp = z.log_softmax(-1)[y]; H = -sum p log p`.
Memory claims are checked by recording every tensor the ATen ops allocate (a dispatch mode)
and every tensor autograd saves for backward.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers.memory import AllocationRecorder, LiveBytes

from frlab.ops.logprobs import sampled_logprobs_and_entropy


def naive(logits: torch.Tensor, targets: torch.Tensor, tau: float = 1.0):
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    logq = (logits.to(dtype) / tau).log_softmax(-1)
    logp = logq.gather(1, targets[:, None]).squeeze(1)
    entropy = -(logq.exp() * logq).sum(-1)
    return logp, entropy


def make(n: int, v: int, dtype=torch.float32, seed: int = 0, scale: float = 3.0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, v, generator=g, dtype=torch.float64) * scale).to(dtype)
    targets = torch.randint(0, v, (n,), generator=g)
    return logits.requires_grad_(True), targets


@pytest.mark.parametrize("chunk_size", [1, 7, 16, 1000])
@pytest.mark.parametrize("tau", [1.0, 0.6, 1.7])
def test_values_and_grads_match_naive_fp32(chunk_size: int, tau: float) -> None:
    logits, y = make(37, 53)
    logp, ent = sampled_logprobs_and_entropy(logits, y, temperature=tau, chunk_size=chunk_size)
    ref_logp, ref_ent = naive(logits, y, tau)
    assert logp.dtype == torch.float32 and ent is not None and ent.dtype == torch.float32
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)
    w = torch.randn(37)
    (grad,) = torch.autograd.grad((w * logp).sum(), logits)
    (ref_grad,) = torch.autograd.grad((w * ref_logp).sum(), logits)
    torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=0)


def test_float64_gradcheck_and_dtype() -> None:
    logits, y = make(6, 11, dtype=torch.float64)
    logp, ent = sampled_logprobs_and_entropy(logits, y, temperature=0.8, chunk_size=4)
    assert logp.dtype == torch.float64 and ent.dtype == torch.float64
    torch.testing.assert_close(logp, naive(logits, y, 0.8)[0], atol=1e-12, rtol=0)
    assert torch.autograd.gradcheck(
        lambda x: sampled_logprobs_and_entropy(x, y, temperature=0.8, chunk_size=4)[0], (logits,)
    )


def test_hand_computed_two_token_vocab() -> None:
    """logits [0, ln 3] -> p = [1/4, 3/4]: logp(1) = ln(3/4), H = -(1/4 ln 1/4 + 3/4 ln 3/4),
    d logp(1) / d logits = onehot(1) - p = [-1/4, 1/4]."""
    logits = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.float64, requires_grad=True)
    logp, ent = sampled_logprobs_and_entropy(logits, torch.tensor([1]))
    assert logp.item() == pytest.approx(math.log(0.75), abs=1e-12)
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-12)
    logp.sum().backward()
    torch.testing.assert_close(logits.grad, torch.tensor([[-0.25, 0.25]], dtype=torch.float64))


def test_bf16_logits_computed_in_float32() -> None:
    logits, y = make(20, 300, dtype=torch.bfloat16)
    logp, ent = sampled_logprobs_and_entropy(logits, y, chunk_size=6)
    ref_logp, ref_ent = naive(logits, y)
    assert logp.dtype == torch.float32
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)
    (grad,) = torch.autograd.grad(logp.sum(), logits)
    (ref_grad,) = torch.autograd.grad(ref_logp.sum(), logits)
    assert grad.dtype == torch.bfloat16
    torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=8e-3)  # one bf16 ulp


def test_entropy_detached_and_optional() -> None:
    logits, y = make(5, 9)
    logp, ent = sampled_logprobs_and_entropy(logits, y)
    assert logp.requires_grad and not ent.requires_grad
    logp2, none = sampled_logprobs_and_entropy(logits, y, compute_entropy=False)
    assert none is None
    torch.testing.assert_close(logp2, logp)


def test_extreme_and_masked_logits_stay_finite() -> None:
    logits, y = make(8, 10, dtype=torch.float64, scale=1e4)
    logits = logits.detach()
    logits[:, 0] = -math.inf  # a masked vocabulary entry
    y = torch.where(y == 0, torch.ones_like(y), y)
    logits.requires_grad_(True)
    logp, ent = sampled_logprobs_and_entropy(logits, y, chunk_size=3)
    ref_logp = (logits / 1.0).log_softmax(-1).gather(1, y[:, None]).squeeze(1)
    torch.testing.assert_close(logp, ref_logp)
    assert torch.isfinite(ent).all() and (ent >= 0).all()
    logp.sum().backward()
    assert torch.isfinite(logits.grad).all()
    assert (logits.grad[:, 0] == 0).all()


def test_empty_rows() -> None:
    logp, ent = sampled_logprobs_and_entropy(torch.zeros(0, 5), torch.zeros(0, dtype=torch.long))
    assert logp.shape == (0,) and ent.shape == (0,)


def test_no_float32_copy_of_the_whole_logits() -> None:
    """bf16 [N,V] logits: forward and backward each allocate exactly one float32 chunk buffer
    per chunk and nothing else that large, except the bf16 gradient buffer in backward;
    autograd saves the input itself (no copy) plus per-row vectors."""
    n, v, chunk = 64, 512, 8
    logits, y = make(n, v, dtype=torch.bfloat16)
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    rec = AllocationRecorder()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), rec:
        logp, _ = sampled_logprobs_and_entropy(logits, y, chunk_size=chunk)
    forward_allocs = list(rec.allocs)
    assert max(numel for _, _, numel in forward_allocs) <= chunk * v
    # exactly one float32 chunk buffer per chunk, nothing else of that size
    chunk_bufs = [dt for _, dt, numel in forward_allocs if numel == chunk * v]
    assert chunk_bufs == [torch.float32] * (n // chunk)
    big_saved = [t for t in saved if t.numel() >= n * v]
    assert len(big_saved) == 1 and big_saved[0].data_ptr() == logits.data_ptr()
    assert all(t.numel() <= n for t in saved if t.numel() < n * v)
    rec.allocs.clear()
    with rec:
        logp.sum().backward()
    assert [dt for _, dt, numel in rec.allocs if numel == chunk * v] == [torch.float32] * (
        n // chunk
    )
    big = [(op, dt) for op, dt, numel in rec.allocs if numel > chunk * v]
    assert big and all(dt == torch.bfloat16 for _, dt in big)
    assert len(big) == 1  # the gradient buffer, nothing else of that size


def test_recorder_flags_the_naive_path() -> None:
    """The memory test above can fail: naive log_softmax allocates float32 [N, V] tensors."""
    logits, y = make(64, 512, dtype=torch.bfloat16)
    rec = AllocationRecorder()
    with rec:
        naive(logits, y)
    assert any(dt == torch.float32 and numel == 64 * 512 for _, dt, numel in rec.allocs)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"logits": torch.zeros(4)}, "logits"),
        ({"logits": torch.zeros(2, 3, dtype=torch.long)}, "logits"),
        ({"logits": torch.zeros(2, 0)}, "vocabulary"),
        ({"targets": torch.zeros(3, dtype=torch.long)}, "targets"),
        ({"targets": torch.zeros(2, dtype=torch.int32)}, "targets"),
        ({"targets": torch.tensor([0, 5])}, "targets"),
        ({"targets": torch.tensor([0, -1])}, "targets"),
        ({"targets": [0, 1]}, "targets"),
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"chunk_size": 2.5}, "chunk_size"),
    ],
)
def test_validation_errors_name_the_field(kwargs: dict, field: str) -> None:
    args = {"logits": torch.zeros(2, 5), "targets": torch.tensor([0, 4])}
    args.update(kwargs)
    logits, targets = args.pop("logits"), args.pop("targets")
    with pytest.raises(ValueError, match=field):
        sampled_logprobs_and_entropy(logits, targets, **args)


def test_large_vocab_more_accurate_than_naive_float32() -> None:
    """Against a float64 reference at V = 32k, the chunked float32 path stays within 1e-5 for
    log-probs and entropies (the naive float32 log_softmax drifts more as V grows)."""
    logits, y = make(8, 32_768, scale=3.0)
    logits = logits.detach()
    ref_logp, ref_ent = naive(logits.double(), y)
    logp, ent = sampled_logprobs_and_entropy(logits, y, chunk_size=3)
    torch.testing.assert_close(logp.double(), ref_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent.double(), ref_ent, atol=1e-5, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_peak_memory_at_a_qwen_vocabulary() -> None:
    """On CUDA at V = 151,936 with bf16 logits, the forward's peak extra memory is one float32
    chunk (plus allocator slack), a quarter of the logits' size at most here."""
    n, v, chunk = 2048, 151_936, 128
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    logits = (torch.randn(n, v, device=dev, generator=g) * 3).to(torch.bfloat16).requires_grad_()
    y = torch.randint(0, v, (n,), device=dev, generator=g)
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    logp, ent = sampled_logprobs_and_entropy(logits, y, chunk_size=chunk)
    torch.cuda.synchronize(dev)
    extra = torch.cuda.max_memory_allocated(dev) - base
    assert extra <= 1.1 * chunk * v * 4 + (16 << 20)
    assert extra <= 0.25 * logits.numel() * logits.element_size()
    ref_logp, ref_ent = naive(logits.detach().double(), y)
    torch.testing.assert_close(logp.double(), ref_logp, atol=2e-5, rtol=0)
    torch.testing.assert_close(ent.double(), ref_ent, atol=2e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_holds_one_float32_chunk_at_a_time(dtype: torch.dtype) -> None:
    """The forward's peak extra memory is one float32 chunk (and a few [N] vectors): each
    chunk's buffer is freed before the next is made (with two alive, the peak is two)."""
    n, v, chunk = 96, 4096, 16
    logits, y = make(n, v, dtype=dtype)
    recorder = LiveBytes()
    with recorder:
        sampled_logprobs_and_entropy(logits, y, chunk_size=chunk)
    one_chunk = chunk * v * 4
    assert one_chunk <= recorder.peak <= one_chunk + 64 * n * 4


def test_backward_holds_one_float32_chunk_beside_the_gradient() -> None:
    n, v, chunk = 96, 4096, 16
    logits, y = make(n, v)
    logp, _ = sampled_logprobs_and_entropy(logits, y, chunk_size=chunk, compute_entropy=False)
    recorder = LiveBytes()
    with recorder:
        (grad,) = torch.autograd.grad(logp.sum(), logits)
    gradient, one_chunk = n * v * 4, chunk * v * 4
    assert gradient + one_chunk <= recorder.peak <= gradient + one_chunk + 64 * n * 4


def test_chunk_bytes_by_device() -> None:
    """64 MiB chunks on a CPU; a CUDA device gets 1/512 of its memory, 64 to 256 MiB."""
    from frlab.ops.logprobs import CHUNK_BYTES, chunk_bytes, rows_per_chunk

    assert chunk_bytes("cpu") == chunk_bytes(None) == CHUNK_BYTES == 64 << 20
    assert rows_per_chunk(1024, 151_936, "cpu") == 110
    assert rows_per_chunk(64, 151_936, "cpu") == 64
    if torch.cuda.is_available():
        total = torch.cuda.get_device_properties(0).total_memory
        assert chunk_bytes("cuda:0") == max(CHUNK_BYTES, min(256 << 20, total // 512))
