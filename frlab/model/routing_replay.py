"""Rollout routing replay for Qwen3-MoE: record the sampler's experts, reuse them in the learner.

Why (FlashREINFORCE paper, Sec. 3, and its MoE setting): FlashREINFORCE's token ratio
`rho_t = pi_theta(y_t | y_<t) / mu(y_t | y_<t)` divides the learner's log-prob by the one the
sampler stored. In a mixture-of-experts model the top-k expert choice is discrete: a tiny
difference in the router's input (other kernels, batch shapes, bf16, a weight update in flight)
flips an expert and moves the token's log-prob by far more than the gate `delta` tolerates.
Routing replay removes that source: the engine records, for every token and every MoE layer,
the `top_k` experts it used; the learner forces those experts in its own forward. The routing
WEIGHTS are still computed from the learner's current router logits, restricted to the forced
experts and renormalised as the model does (`norm_topk_prob`), so gradients still reach the
router.

API (instance-level patches of each `Qwen3MoeSparseMoeBlock.gate`, undone on exit; nothing
global is monkeypatched, so other models in the process are untouched):

- `record_routing(model)` -> `RoutingRecord`: every forward call inside the context appends one
  step `[B, t, L, k]` (B rows, t new tokens, L MoE layers in model order, k = top_k). With KV-cache
  decoding the prefill is one step and each decode step adds `t = 1`; `record.indices()`
  concatenates the steps along time to `[B, T, L, k]` (`[0]` is one sequence's `[T, L, k]`).
- `replay_routing(model, routing)`: `routing` is `[B, T, L, k]` (or `[T, L, k]` for B = 1);
  every forward inside the context must have exactly B * T tokens. Run backward inside the
  context when gradient checkpointing is on (the recomputed forward must replay too).
- `pad_routing(routings, length)`: stack per-sequence `[T_i, L, k]` into the right-padded
  `[B, length, L, k]` the learner's `RolloutBatch` layout needs.

Layer index L counts MoE blocks only (dense `mlp_only_layers` are skipped). Indices are stored as
int16 (experts < 32768), 2 bytes per (token, layer, k).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

INDEX_DTYPE = torch.int16


def moe_routers(model: nn.Module) -> list[nn.Module]:
    """The top-k router (`block.gate`) of every sparse MoE block, in forward (layer) order."""
    routers = []
    for module in model.modules():
        if type(module).__name__.endswith("SparseMoeBlock"):
            gate = getattr(module, "gate", None)
            if gate is None or not hasattr(gate, "top_k") or not hasattr(gate, "weight"):
                raise TypeError(
                    f"{type(module).__name__}.gate is not a top-k router (needs .top_k, .weight)"
                )
            routers.append(gate)
    if not routers:
        raise ValueError(f"model {type(model).__name__} has no sparse MoE blocks to route")
    return routers


def replayed_router_output(
    router: nn.Module, hidden_states: Tensor, indices: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The router's `(logits, weights, indices)` with the experts forced to `indices` [N, k].

    Mirrors `Qwen3MoeTopKRouter.forward` op for op, with `topk` replaced by a gather of the
    forced experts: softmax over all experts in float32, the forced probabilities, divided by
    their sum when `norm_topk_prob`, cast back to the logits' dtype. When `indices` are the
    router's own top-k this is bitwise the router's output; the weights stay differentiable in
    the router weight.
    """
    hidden_states = hidden_states.reshape(-1, router.hidden_dim)
    logits = F.linear(hidden_states, router.weight)
    probs = torch.softmax(logits, dtype=torch.float, dim=-1)
    forced = indices.to(device=logits.device, dtype=torch.long)
    weights = probs.gather(-1, forced)
    if router.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return logits, weights.to(logits.dtype), forced


@contextlib.contextmanager
def _patched_forwards(
    routers: list[nn.Module], make: Callable[[int, Callable[..., Any]], Callable[..., Any]]
) -> Iterator[None]:
    """Set `router.forward = make(layer, previous_forward)` per instance; restore on exit."""
    saved: list[tuple[nn.Module, bool, Any]] = []
    try:
        for layer, router in enumerate(routers):
            had_own = "forward" in router.__dict__
            saved.append((router, had_own, router.__dict__.get("forward")))
            router.forward = make(layer, router.forward)
        yield
    finally:
        for router, had_own, previous in reversed(saved):
            if had_own:
                router.forward = previous
            else:
                del router.forward


@dataclass
class RoutingRecord:
    """Expert indices recorded per forward call: `steps[i]` is `[B, t, L, k]` (int16, CPU).

    Each forward moves its indices to the CPU once (one device sync per forward, not per layer).
    """

    num_layers: int
    top_k: int
    steps: list[Tensor] = field(default_factory=list)
    _pending: list[Tensor | None] = field(default_factory=list, repr=False)
    _shape: tuple[int, int] | None = field(default=None, repr=False)

    def _begin(self, batch: int, tokens: int) -> None:
        self._shape = (batch, tokens)
        self._pending = [None] * self.num_layers

    def _store(self, layer: int, indices: Tensor) -> None:
        if self._shape is None:
            raise RuntimeError("router called outside a model forward while recording routing")
        self._pending[layer] = indices.detach().to(INDEX_DTYPE)
        if all(p is not None for p in self._pending):
            b, t = self._shape
            step = torch.stack(self._pending, dim=1).cpu()  # type: ignore[arg-type]
            if step.shape[0] != b * t:
                raise RuntimeError(f"router saw {step.shape[0]} tokens, the forward had {b}x{t}")
            self.steps.append(step.reshape(b, t, self.num_layers, self.top_k))
            self._shape, self._pending = None, []

    def indices(self) -> Tensor:
        """All steps concatenated along time: `[B, T, L, k]` (batch size must stay constant)."""
        if not self.steps:
            raise ValueError("RoutingRecord is empty: no forward ran inside record_routing")
        sizes = {s.shape[0] for s in self.steps}
        if len(sizes) != 1:
            raise ValueError(
                f"RoutingRecord steps have batch sizes {sorted(sizes)}: attribute rows per step"
            )
        return torch.cat(self.steps, dim=1)


@contextlib.contextmanager
def record_routing(model: nn.Module) -> Iterator[RoutingRecord]:
    """Record the top-k experts every MoE layer picks, per forward call (see module docstring)."""
    routers = moe_routers(model)
    if any(r.num_experts > torch.iinfo(INDEX_DTYPE).max for r in routers):
        raise ValueError(f"num_experts exceeds what {INDEX_DTYPE} routing indices can hold")
    record = RoutingRecord(num_layers=len(routers), top_k=int(routers[0].top_k))

    def begin(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        embeds = kwargs.get("inputs_embeds")
        shaped = ids if ids is not None else embeds
        if shaped is None:
            raise ValueError("record_routing needs input_ids or inputs_embeds in the forward")
        record._begin(int(shaped.shape[0]), int(shaped.shape[1]))

    def make(layer: int, previous: Callable[..., Any]) -> Callable[..., Any]:
        def forward(hidden_states: Tensor) -> Any:
            out = previous(hidden_states)
            record._store(layer, out[2])
            return out

        return forward

    handle = model.register_forward_pre_hook(begin, with_kwargs=True)
    try:
        with _patched_forwards(routers, make):
            yield record
    finally:
        handle.remove()


def check_routing(routing: Tensor, num_layers: int, top_k: int, num_experts: int) -> Tensor:
    """`routing` as `[B, T, L, k]` (a `[T, L, k]` gets B = 1); ValueError naming what is wrong."""
    if not isinstance(routing, Tensor) or routing.is_floating_point() or routing.is_complex():
        raise ValueError("routing must be an integer tensor of expert indices")
    if routing.dim() == 3:
        routing = routing.unsqueeze(0)
    if routing.dim() != 4 or tuple(routing.shape[2:]) != (num_layers, top_k):
        raise ValueError(
            f"routing has shape {tuple(routing.shape)}, expected [B, T, {num_layers}, {top_k}]"
        )
    if routing.numel() and (int(routing.min()) < 0 or int(routing.max()) >= num_experts):
        raise ValueError(f"routing has expert indices outside [0, {num_experts})")
    return routing


@contextlib.contextmanager
def replay_routing(model: nn.Module, routing: Tensor) -> Iterator[None]:
    """Force every MoE layer to the recorded experts `routing` `[B, T, L, k]` (see module doc)."""
    routers = moe_routers(model)
    routing = check_routing(
        routing, len(routers), int(routers[0].top_k), int(routers[0].num_experts)
    )
    b, t = int(routing.shape[0]), int(routing.shape[1])

    def make(layer: int, _previous: Callable[..., Any]) -> Callable[..., Any]:
        router = routers[layer]
        forced = routing[:, :, layer, :].reshape(b * t, -1)

        def forward(hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            n = hidden_states.numel() // router.hidden_dim
            if n != b * t:
                raise ValueError(f"replay_routing has routing for {b}x{t} tokens, forward has {n}")
            return replayed_router_output(router, hidden_states, forced)

        return forward

    with _patched_forwards(routers, make):
        yield


def pad_routing(routings: Sequence[Tensor], length: int) -> Tensor:
    """Right-pad per-sequence `[T_i, L, k]` routings to `[B, length, L, k]` (int16).

    Positions past `T_i` (padding, and a final token the sampler never fed back) get experts
    `0..k-1`: under a causal mask they cannot change the log-probs of earlier positions.
    """
    if not routings:
        raise ValueError("pad_routing got no routings")
    shapes = {tuple(r.shape[1:]) for r in routings}
    if len(shapes) != 1 or any(r.dim() != 3 for r in routings):
        raise ValueError(f"pad_routing: routings must all be [T_i, L, k], got {sorted(shapes)}")
    num_layers, top_k = shapes.pop()
    if any(r.shape[0] > length for r in routings):
        raise ValueError(f"pad_routing: a routing is longer than length={length}")
    filler = torch.arange(top_k, dtype=INDEX_DTYPE).expand(len(routings), length, num_layers, -1)
    out = filler.clone()
    for row, r in enumerate(routings):
        out[row, : r.shape[0]] = r.to(INDEX_DTYPE)
    return out
