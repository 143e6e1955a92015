"""Sampled-token log-probs and full entropies from logits, in row chunks.

The FlashREINFORCE objective needs, for every policy token, the current policy's log-prob of the
token the sampler emitted, `log softmax(z / tau)[y]`, and (for the entropy token filter) the
full categorical entropy `H = lse(z/tau) - sum_v p_v z_v / tau`. The naive path,
`logits.float().log_softmax(-1)`, materialises a float32 copy of the whole `[N, V]` tensor
(for bf16 logits of a 150k vocabulary that is twice the logits' own size) and autograd keeps
it for backward. Here the forward works on `chunk_size` rows at a time and saves only the
input and the per-row log-sum-exp; backward recomputes each chunk's softmax and writes
`d logp / d z = (onehot(y) - softmax(z / tau)) / tau` straight into the gradient buffer.

Memory beyond the input: the forward works in place on one `chunk_size x V` buffer in the
compute dtype (4 * chunk_size * V bytes in float32), released before the next chunk's is
made, so one chunk is alive at a time; the backward adds the `[N, V]` gradient in the input's
dtype (as any backward through logits must) and one such chunk buffer. A chunk's rows are
capped so that its buffer stays within `chunk_bytes(device)`: 64 MiB on a CPU (larger chunks
gain nothing there), 1/512 of the memory of a CUDA device, between 64 and 256 MiB (a 152k
vocabulary then takes about 440 rows per chunk on a GPU of 141 GB, 280 on one of 80 GB: few
large matmuls instead of hundreds of 110-row ones; past a few hundred rows the head's matmul
is as efficient as it gets and a larger chunk only adds to the peak).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def compute_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every other float dtype is computed in float32 (as the objective)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_chunking(temperature: float, chunk_size: int) -> None:
    """Validate the two scalar knobs shared by every chunked log-prob helper."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ValueError(f"temperature must be a positive float, got {temperature!r}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be positive and finite, got {temperature}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")


# A chunk's float32 [rows, V] buffer on a CPU never exceeds this: at a 152k vocabulary the
# default chunk_size of 1024 rows would otherwise be a 622 MB buffer, larger than many whole
# batches there.
CHUNK_BYTES = 64 << 20
# On a CUDA device: this share of its memory, at most CUDA_CHUNK_CAP bytes.
CUDA_CHUNK_SHARE = 1 / 512
CUDA_CHUNK_CAP = 256 << 20


def chunk_bytes(device: torch.device | str | None = None) -> int:
    """The largest float32 chunk of logits for `device` (see the module docstring)."""
    device = torch.device("cpu" if device is None else device)
    if device.type != "cuda":
        return CHUNK_BYTES
    total = torch.cuda.get_device_properties(device).total_memory
    return max(CHUNK_BYTES, min(CUDA_CHUNK_CAP, int(total * CUDA_CHUNK_SHARE)))


def rows_per_chunk(chunk_size: int, vocab: int, device: torch.device | str | None = None) -> int:
    """`chunk_size`, capped so that one float32 chunk of logits stays within chunk_bytes."""
    return capped_rows(chunk_size, vocab, chunk_bytes(device))


def capped_rows(chunk_size: int, vocab: int, cap_bytes: int) -> int:
    """`chunk_size` rows at most, and no more than fit a float32 chunk of `cap_bytes`."""
    return max(1, min(int(chunk_size), int(cap_bytes) // (4 * max(1, int(vocab)))))


def check_targets(targets: Tensor, n: int, vocab: int, device: torch.device) -> None:
    """`targets` must be a long vector of `n` token ids in [0, vocab) on `device`."""
    if targets.dim() != 1 or targets.shape[0] != n:
        raise ValueError(f"targets must have shape [{n}], got {list(targets.shape)}")
    if targets.dtype != torch.long:
        raise ValueError(f"targets must be torch.long, got {targets.dtype}")
    if targets.device != device:
        raise ValueError(f"targets is on {targets.device}, expected {device}")
    if n and bool(((targets < 0) | (targets >= vocab)).any()):  # one host sync
        raise ValueError(
            f"targets must lie in [0, {vocab}), got [{int(targets.min())}, {int(targets.max())}]"
        )


def tempered_chunk(logits: Tensor, dtype: torch.dtype, temperature: float) -> Tensor:
    """A fresh `dtype` copy of a logits chunk divided by the temperature (safe to modify)."""
    z = logits.to(dtype, copy=True)
    return z.div_(temperature) if temperature != 1.0 else z


def chunk_stats_(
    z: Tensor, targets: Tensor, compute_entropy: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    """(logp of targets, logsumexp, entropy or None) of tempered logits `z` [c, V].

    Works in place on `z` and allocates nothing else of its size. With m = max z,
    e = exp(z - m) and S = sum e: lse = m + log S, and H = log S - sum e log e / S.
    """
    target_z = z.gather(1, targets[:, None]).squeeze(1)
    m = z.amax(dim=-1, keepdim=True)
    e = z.sub_(m).exp_()  # -inf logits -> 0
    total = e.sum(dim=-1)
    lse = m.squeeze(1) + total.log()
    entropy = None
    if compute_entropy:
        entropy = total.log() - e.xlogy_(e).sum(dim=-1) / total  # xlogy(0, 0) = 0
    return target_z - lse, lse, entropy


def softmax_grad_(z: Tensor, lse: Tensor, targets: Tensor, grad_logp: Tensor, tau: float) -> Tensor:
    """In place on tempered logits `z`: d(sum_i g_i logp_i)/d logits = g_i (onehot - p_i) / tau."""
    scale = grad_logp / tau
    grad = z.sub_(lse[:, None]).exp_().mul_(-scale[:, None])
    grad.scatter_add_(1, targets[:, None], scale[:, None])
    return grad


class _ChunkedSampledLogProb(torch.autograd.Function):
    """logits [N,V] -> (logp [N], entropy [N] detached); saves logits and lse only."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        logits: Tensor,
        targets: Tensor,
        temperature: float,
        chunk_size: int,
        compute_entropy: bool,
    ) -> tuple[Tensor, Tensor]:
        cdtype = compute_dtype_for(logits.dtype)
        n = logits.shape[0]
        logp = torch.empty(n, dtype=cdtype, device=logits.device)
        lse = torch.empty(n, dtype=cdtype, device=logits.device)
        entropy = torch.zeros(n if compute_entropy else 0, dtype=cdtype, device=logits.device)
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            z = tempered_chunk(logits[s:e], cdtype, temperature)
            lp, ls, ent = chunk_stats_(z, targets[s:e], compute_entropy)
            logp[s:e], lse[s:e] = lp, ls
            if ent is not None:
                entropy[s:e] = ent
            del z  # freed before the next chunk's buffer is made: one chunk alive at a time
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad_logp: Tensor, _grad_entropy: Tensor
    ) -> tuple[Tensor | None, None, None, None, None]:
        logits, targets, lse = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        grad_logits = torch.empty_like(logits)
        n, tau = logits.shape[0], ctx.temperature
        for s in range(0, n, ctx.chunk_size):
            e = min(s + ctx.chunk_size, n)
            z = tempered_chunk(logits[s:e], lse.dtype, tau)
            grad_logits[s:e] = softmax_grad_(z, lse[s:e], targets[s:e], grad_logp[s:e], tau)
            del z
        return grad_logits, None, None, None, None


def sampled_logprobs_and_entropy(
    logits: Tensor,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    compute_entropy: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of `targets` under softmax(logits / temperature), and its full entropy.

    logits: [N, V] of any float dtype; targets: long [N]. Returns `(logp [N], entropy [N] or
    None)` in float32 (float64 for float64 logits). `logp` is differentiable w.r.t. `logits`;
    `entropy` is detached. Peak extra memory is O(chunk_size * V) in the compute dtype, never a
    float32 copy of the whole `[N, V]` tensor.
    """
    if not isinstance(logits, Tensor) or logits.dim() != 2:
        raise ValueError(
            f"logits must be a 2-D [N, V] tensor, got {getattr(logits, 'shape', None)}"
        )
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a float tensor, got {logits.dtype}")
    if logits.shape[1] == 0:
        raise ValueError("logits has an empty vocabulary dimension (V = 0)")
    if not isinstance(targets, Tensor):
        raise ValueError(f"targets must be a tensor, got {type(targets).__name__}")
    check_chunking(temperature, chunk_size)
    check_targets(targets, logits.shape[0], logits.shape[1], logits.device)
    logp, entropy = _ChunkedSampledLogProb.apply(
        logits,
        targets,
        float(temperature),
        rows_per_chunk(chunk_size, logits.shape[1], logits.device),
        bool(compute_entropy),
    )
    return logp, (entropy if compute_entropy else None)
