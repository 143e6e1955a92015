"""Packed attention as one varlen call per layer (frlab.model.varlen): exact against the padded
forward, the choice of kernel, and the installed torch's own varlen code.

On a CPU, torch's real `varlen_attn` (argument checks, custom op, registered autograd) runs
with a CPU kernel for the two ATen ops it calls (helpers.varlen); its outputs are held to
torch's own fake of the op. The `gpu` tests run the real FlashAttention-2 kernel.
"""

from __future__ import annotations

import functools

import pytest
import torch
from helpers.models import policy_of
from helpers.varlen import cpu_flash_forward, cpu_flash_kernels

from frlab.model import varlen
from frlab.model.lm_logprobs import sequence_logprobs
from frlab.model.packed_attention import PACKED_VARLEN, packed_attention, packed_kernel
from frlab.model.policy import enable_checkpointing, tiny_config

VOCAB = 96
LENGTHS = [5, 17, 9, 2, 30, 1, 17, 5, 5]


def _model(arch: str, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    config = tiny_config(arch, vocab_size=VOCAB)
    if arch == "qwen3_moe":
        config._experts_implementation = "eager"  # grouped_mm has no float64 kernel
    return policy_of(config=config, seed=0, attn_implementation="sdpa").to(dtype)


def _batch(lengths=LENGTHS, seed: int = 3, device: str = "cpu"):
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    mask = torch.arange(width)[None] < torch.tensor(lengths)[:, None]
    ids = torch.where(mask, torch.randint(0, VOCAB, (len(lengths), width), generator=gen), 0)
    action = mask.clone()
    action[:, 0] = False
    return ids.to(device), mask.to(device), action.to(device)


def _run(model, ids, mask, action, *, kernel: str | None):
    """Log-probs, entropies and parameter gradients; kernel None: the padded forward."""
    model.zero_grad(set_to_none=True)
    context = packed_attention(model, kernel) if kernel else torch.enable_grad()
    with context:
        lp, ent = sequence_logprobs(
            model,
            ids,
            mask,
            action_mask=action,
            compute_entropy=True,
            chunk_size=7,
            pack=kernel is not None,
        )
        weights = torch.linspace(0.1, 1.0, ids.shape[1], dtype=lp.dtype, device=lp.device)
        (lp * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach(), ent, grads


@pytest.fixture
def cpu_varlen(monkeypatch):  # noqa: ANN001, ANN201
    """torch's varlen attention runnable on this CPU (its kernel replaced, nothing else)."""
    monkeypatch.setattr(varlen, "varlen_available", lambda device, dtype, config: "")
    with cpu_flash_kernels():
        yield


def _assert_same(got, want, tol: float) -> None:
    for a, b in zip(got[:2], want[:2], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=tol)
    assert got[2].keys() == want[2].keys() and len(want[2]) > 10
    for name, grad in want[2].items():
        torch.testing.assert_close(got[2][name], grad, rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3_moe"])
def test_varlen_packed_equals_padded(arch: str, cpu_varlen) -> None:  # noqa: ANN001
    model = _model(arch)
    ids, mask, action = _batch()
    padded = _run(model, ids, mask, action, kernel=None)
    calls = []
    real = varlen.varlen_kernel()

    @functools.wraps(real)  # the real signature: the options are read from it
    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append((args[0].shape, args[1].shape, kwargs))
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(varlen, "varlen_kernel", lambda: spy)
        packed = _run(model, ids, mask, action, kernel="varlen")
    assert model.config._attn_implementation == "sdpa"  # restored
    _assert_same(packed, padded, 1e-12)
    layers = model.config.num_hidden_layers
    assert len(calls) == layers  # one call per layer (no recomputation here)
    (q_shape, k_shape, kwargs) = calls[0]
    assert q_shape == (sum(LENGTHS), 4, 16) and k_shape == (sum(LENGTHS), 2, 16)
    assert kwargs["enable_gqa"] is True and kwargs["window_size"] == (-1, 0)


def test_varlen_repeats_kv_heads_where_the_kernel_cannot_share_them(cpu_varlen) -> None:  # noqa: ANN001
    model = _model("qwen2")
    ids, mask, action = _batch()
    padded = _run(model, ids, mask, action, kernel=None)
    real = varlen.varlen_kernel()
    seen = []

    def no_gqa(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1)):  # noqa: ANN001, ANN202
        seen.append(k.shape[1])
        return real(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, window_size=window_size)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(varlen, "varlen_kernel", lambda: no_gqa)
        packed = _run(model, ids, mask, action, kernel="varlen")
    assert set(seen) == {4}  # K/V repeated to the 4 query heads
    _assert_same(packed, padded, 1e-12)


def test_varlen_under_autocast_takes_one_dtype(cpu_varlen) -> None:  # noqa: ANN001
    """bf16 autocast over float32 weights (trainer.precision=bf16-mixed): the rotary embedding
    leaves q and k in float32 beside a bf16 v; the kernel gets all three in bf16 and the
    packed forward matches the padded one under the same autocast."""
    model = _model("qwen2", torch.float32)
    ids, mask, action = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        padded = _run(model, ids, mask, action, kernel=None)
        packed = _run(model, ids, mask, action, kernel="varlen")
    for got, want in zip(packed[:2], padded[:2], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0.1)
    for name, grad in padded[2].items():
        scale = float(grad.abs().max()) or 1.0
        assert float((packed[2][name] - grad).abs().max()) <= 0.05 * scale, name


def test_varlen_with_activation_checkpointing(cpu_varlen) -> None:  # noqa: ANN001
    model = _model("qwen2")
    ids, mask, action = _batch()
    want = _run(model, ids, mask, action, kernel=None)
    enable_checkpointing(model)
    model.train()
    _assert_same(_run(model, ids, mask, action, kernel="varlen"), want, 1e-12)


def test_cpu_kernel_agrees_with_torchs_own_fake_of_the_op() -> None:
    """The CPU kernel's outputs have the shapes and dtypes torch's registered fake gives."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k = torch.randn(12, 4, 8, dtype=torch.bfloat16), torch.randn(12, 2, 8, dtype=torch.bfloat16)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    ours = cpu_flash_forward(q, k, k, cu, cu, 7, 7, 0.0, True, False)
    with FakeTensorMode() as mode:
        fq, fk, fcu = (mode.from_tensor(t) for t in (q, k, cu))
        theirs = torch.ops.torch_attn._varlen_attn(fq, fk, fk, fcu, fcu, 7, 7, True)
    for a, b in zip(ours[:3], theirs, strict=True):
        assert (a.shape, a.dtype) == (b.shape, b.dtype)


def test_causal_option_and_gqa_read_from_the_signature() -> None:
    def windowed(q, k, v, cq, ck, mq, mk, *, scale=None, window_size=(-1, -1), enable_gqa=False):  # noqa: ANN001, ANN202
        return q

    def flagged(q, k, v, cq, ck, mq, mk, *, is_causal=False, scale=None):  # noqa: ANN001, ANN202
        return q

    def neither(q, k, v, cq, ck, mq, mk, *, scale=None):  # noqa: ANN001, ANN202
        return q

    assert varlen.causal_options(windowed) == {"window_size": (-1, 0)}
    assert varlen.causal_options(flagged) == {"is_causal": True}
    assert varlen.causal_options(neither) is None
    assert varlen.takes_gqa(windowed) and not varlen.takes_gqa(flagged)
    real = varlen.varlen_kernel()
    assert real is not None and varlen.causal_options(real) is not None  # this torch's


def test_varlen_available_names_why_not(monkeypatch) -> None:  # noqa: ANN001
    config = tiny_config("qwen2", vocab_size=VOCAB)
    cuda, bf16 = torch.device("cuda"), torch.bfloat16
    assert "cpu device" in varlen.varlen_available(torch.device("cpu"), bf16, config)
    assert "float32" in varlen.varlen_available(cuda, torch.float32, config)
    monkeypatch.setattr(varlen.torch.version, "hip", None)
    monkeypatch.setattr(varlen.torch.cuda, "get_device_capability", lambda device: (7, 5))
    assert "capability 7.5" in varlen.varlen_available(cuda, bf16, config)
    monkeypatch.setattr(varlen.torch.cuda, "get_device_capability", lambda device: (9, 0))
    monkeypatch.setattr(varlen, "kernel_check", lambda device, dtype: "")
    assert varlen.varlen_available(cuda, bf16, config) == ""
    monkeypatch.setattr(varlen, "kernel_check", lambda device, dtype: "it failed its check")
    assert varlen.varlen_available(cuda, bf16, config) == "it failed its check"
    monkeypatch.setattr(varlen, "kernel_check", lambda device, dtype: "")
    wide = tiny_config("llama", vocab_size=VOCAB, head_dim=320)
    assert "head dimension 320" in varlen.varlen_available(cuda, torch.float16, wide)
    monkeypatch.setattr(varlen, "varlen_kernel", lambda: None)
    assert "no torch.nn.attention.varlen" in varlen.varlen_available(cuda, bf16, config)


def test_the_kernel_is_checked_once_against_sdpa_before_it_is_chosen(monkeypatch) -> None:  # noqa: ANN001
    """A kernel that runs and agrees passes; one that disagrees or raises is never chosen, and
    the verdict is cached per device and dtype."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(varlen, "_CHECKED", {})
    with cpu_flash_kernels():
        assert varlen.kernel_check(cpu, torch.float32) == ""
    real = varlen.varlen_kernel()

    @functools.wraps(real)
    def wrong(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        return args[0] * 0.5  # connected to the query, but not attention

    @functools.wraps(real)
    def broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(varlen, "varlen_kernel", lambda: wrong)
    assert varlen.kernel_check(cpu, torch.float32) == ""  # cached: not asked again
    monkeypatch.setattr(varlen, "_CHECKED", {})
    assert "disagreed with sdpa" in varlen.kernel_check(cpu, torch.float32)
    monkeypatch.setattr(varlen, "_CHECKED", {})
    monkeypatch.setattr(varlen, "varlen_kernel", lambda: broken)
    assert "failed its check here (RuntimeError: no kernel image" in varlen.kernel_check(
        cpu, torch.float32
    )


def test_auto_takes_sdpa_on_a_cpu_and_varlen_is_refused_naming_why() -> None:
    model = _model("qwen2", torch.float32)
    assert packed_kernel(model) == (
        "sdpa",
        varlen.varlen_available(torch.device("cpu"), torch.float32, model.config),
    )
    with pytest.raises(ValueError, match="varlen attention cannot run here: cpu device"):
        packed_kernel(model, "varlen")
    with pytest.raises(ValueError, match="auto, varlen or sdpa"):
        packed_kernel(model, "flash")


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
def test_cuda_varlen_packed_equals_padded_in_bf16() -> None:
    """The real kernel: packed varlen log-probs and gradients equal the padded sdpa forward to
    bf16 tolerance, and auto picks varlen for a bf16 model on this GPU."""
    model = _model("qwen2", torch.bfloat16).cuda()
    assert packed_kernel(model)[0] == "varlen", packed_kernel(model)
    ids, mask, action = _batch(device="cuda")
    padded = _run(model, ids, mask, action, kernel=None)
    packed = _run(model, ids, mask, action, kernel="auto")
    for got, want in zip(packed[:2], padded[:2], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=5e-2)
    for name, grad in padded[2].items():
        torch.testing.assert_close(
            packed[2][name].float(), grad.float(), rtol=5e-2, atol=5e-2, msg=name
        )


@pytest.mark.gpu
@needs_cuda
def test_cuda_varlen_layers_make_no_host_synchronisation() -> None:
    """Inside the decoder's layers (boundaries built beforehand) nothing waits for the GPU."""
    model = _model("qwen2", torch.bfloat16).cuda()
    ids, mask, _ = _batch(device="cuda")
    lengths = mask.sum(1)
    bounds = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    longest = int(lengths.max())
    positions = (mask.long().cumsum(1) - 1).clamp_min(0)
    row = {"input_ids": ids[mask][None], "position_ids": positions[mask][None]}
    torch.cuda.synchronize()
    with packed_attention(model, "varlen"):
        assert model.config._attn_implementation == PACKED_VARLEN
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = model.model(
                **row,
                use_cache=False,
                cu_seq_lens_q=bounds,
                cu_seq_lens_k=bounds,
                max_length_q=longest,
                max_length_k=longest,
            )
            out.last_hidden_state.float().sum().backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@needs_cuda
def test_cuda_varlen_under_bf16_autocast_over_float32_weights() -> None:
    """trainer.precision=bf16-mixed: auto picks varlen and it matches the padded forward."""
    model = _model("qwen2", torch.float32).cuda()
    ids, mask, action = _batch(device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert packed_kernel(model)[0] == "varlen", packed_kernel(model)
        padded = _run(model, ids, mask, action, kernel=None)
        packed = _run(model, ids, mask, action, kernel="auto")
    for got, want in zip(packed[:2], padded[:2], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=5e-2)
