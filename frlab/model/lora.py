"""LoRA adapters on the policy, built with `peft`: train the adapters only, push only them.

`model.lora.rank > 0` wraps the policy in a peft `PeftModel` (`apply_lora`): low-rank adapters
`B @ A` (rank `rank`, scale `alpha / rank`, `dropout` on their input) beside the modules that
`target_modules` names (module-name suffixes, or peft's `all-linear`: every linear layer but
the LM head), or loaded from a saved adapter folder (`adapter`, trainable). peft freezes every
base weight, so the learner's optimizer holds the adapters only (it takes the parameters that
require gradients); the objective, micro-batching and the learner's log-probs are unchanged
(peft initialises B to zero: the adapted model starts as the base model). A weight push sends
the adapter tensors only (`adapter_state_dict`); the torch engines' copy of the policy is the
same PeftModel, so it loads them by name and samples from base + adapter.

Which modules are adapted, with `all-linear` (`all_linear`): for dense Qwen2 / Llama every
attention projection (q, k, v, o) and MLP projection (gate, up, down); for Qwen3-MoE the
attention projections and the experts' fused weights (`mlp.experts.gate_up_proj`,
`down_proj`: 3D parameters in transformers 5, adapted as parameters), never the router
(`mlp.gate`: adapting it would change the routing that rollout routing replay reproduces)
nor the LM head. `adapted_modules` lists them for a built model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from frlab.errors import ConfigError

ADAPTER_MARKERS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude")
ROUTER_SUFFIXES = ("mlp.gate", "router")  # MoE routers: never adapted


def enabled(lora: Mapping[str, Any] | None) -> bool:
    """Whether a `model.lora` node (every key of frlab.config.schema.LoraConfig) asks for
    adapters (rank > 0)."""
    return bool(lora) and int(lora["rank"]) > 0


def check_lora(lora: Mapping[str, Any]) -> None:
    """What the declaration's ranges cannot say: `model.lora.target_modules` names modules."""
    targets = lora["target_modules"]
    if isinstance(targets, str) or not targets or not all(isinstance(t, str) for t in targets):
        raise ConfigError(
            "model.lora.target_modules",
            f"must be a non-empty list of module names (or [all-linear]), got {targets!r}",
        )


def apply_lora(model: Any, lora: Mapping[str, Any]) -> Any:
    """`model` wrapped in a peft PeftModel with trainable adapters (see the module docstring)."""
    from peft import LoraConfig, PeftModel, get_peft_model

    check_lora(lora)
    adapter = lora["adapter"]
    if adapter:
        return PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
    targets, parameters = list(lora["target_modules"]), None
    if targets == ["all-linear"]:
        targets, parameters = all_linear(model)
    config = LoraConfig(
        r=int(lora["rank"]),
        lora_alpha=float(lora["alpha"]),
        lora_dropout=float(lora["dropout"]),
        target_modules=targets,
        target_parameters=parameters,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def all_linear(model: Any) -> tuple[list[str], list[str] | None]:
    """What `all-linear` adapts, by full name: every `nn.Linear` but the LM head and MoE
    routers, and the weights of fused MoE expert modules (transformers keeps the experts of a
    layer as 3D parameters of one module: peft adapts them as parameters). peft's own
    `all-linear` would adapt a MoE router too."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linear = [
        n
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and m is not head and not n.endswith(ROUTER_SUFFIXES)
    ]
    experts = [
        f"{n}.{p}"
        for n, m in model.named_modules()
        if type(m).__name__.endswith("Experts")
        for p, _ in m.named_parameters(recurse=False)
    ]
    return linear, experts or None


def is_adapter(name: str) -> bool:
    """Whether a state-dict or parameter name belongs to a LoRA adapter."""
    return any(marker in name for marker in ADAPTER_MARKERS)


def is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "merge_and_unload")


def base_of(model: Any) -> Any:
    """The transformers model inside a PeftModel (its adapters injected in place), else the
    model itself: what code that reads a model's structure or forward signature looks at."""
    return model.get_base_model() if is_peft(model) else model


def adapter_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors of a PeftModel's state dict (what a weight push sends)."""
    return {k: v for k, v in state_dict.items() if is_adapter(k)}


def adapted_modules(model: Any) -> list[str]:
    """The names of the modules that carry an adapter in a built PeftModel."""
    return sorted({n.rsplit(".lora_", 1)[0] for n, _ in model.named_parameters() if is_adapter(n)})


def merged(model: Any) -> Any:
    """A plain model with the adapters folded into the base weights (the PeftModel is kept)."""
    import copy

    return copy.deepcopy(model).merge_and_unload()


def check_partial_update(own: Iterable[str], names: Sequence[str]) -> None:
    """KeyError unless `names` are adapter tensors the engine's model has."""
    known = set(own)
    bad = [n for n in names if n not in known or not is_adapter(n)]
    if bad:
        raise KeyError(f"update_weights: {bad[:5]} are not adapter tensors of the engine's model")
