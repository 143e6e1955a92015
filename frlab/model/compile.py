"""`model.compile`: each decoder layer of the learner's policy under `torch.compile`.

Each layer (the `layers` of the base decoder, inside a LoRA wrapper too) is compiled with
dynamic shapes, so a packed row's length and its longest trajectory are symbols, not constants
a new value would recompile for; the packed rows are also padded to a multiple of `BUCKET`
tokens (one extra segment no token attends across and no log-prob is read from), so the shapes
the kernels see take few values. The layers share their compiled code (one class, parameters
passed in as inputs), and a `CompileCounter` backend counts every graph compiled, a recompile
included: `train/compiles` logs the running count. The embeddings, final norm and LM head run
as they are (the head is chunked by hand, frlab.model.lm_head). MoE routing replay is refused
with it (the recorded experts would need the same padding).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from frlab.errors import ConfigError

BUCKET = 256


class CompileCounter:
    """A torch.compile backend that counts the graphs it compiles and hands each to `backend`
    (a name torch.compile takes: inductor, aot_eager, eager)."""

    def __init__(self, backend: str = "inductor") -> None:
        self.backend = backend
        self.compiles = 0
        self._inner: Callable[..., Any] | None = None

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        if self._inner is None:
            from torch._dynamo import lookup_backend

            self._inner = lookup_backend(self.backend)
        self.compiles += 1
        return self._inner(graph, example_inputs)


def decoder_layers(policy: nn.Module) -> nn.ModuleList:
    """The decoder layers of a HF causal LM (its base model's inside a LoRA wrapper)."""
    from frlab.model.lm_logprobs import lm_parts

    decoder, _ = lm_parts(policy)
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        raise ConfigError(
            "model.compile",
            f"model.compile=true: {type(decoder).__name__} has no `layers` list to compile",
        )
    return layers


def compile_layers(policy: nn.Module, backend: str = "inductor") -> CompileCounter:
    """Compile every decoder layer of `policy` in place; returns the counter of compiles."""
    counter = CompileCounter(backend)
    for layer in decoder_layers(policy):
        layer.compile(backend=counter, dynamic=True)
    return counter
