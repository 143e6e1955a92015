"""Checks and copies both torch engines share (frlab.rollout.torch.engine and .process)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from frlab.model.lora import check_partial_update, is_adapter, is_peft
from frlab.model.routing_replay import moe_routers

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def private_copy(model: PreTrainedModel, device: str | torch.device) -> PreTrainedModel:
    """An engine's own copy of `model` on `device`, in eval mode, without gradients."""
    own = copy.deepcopy(model).to(device).eval()
    for p in own.parameters():
        p.requires_grad_(False)
        p.grad = None
    return own


def require_moe(model: PreTrainedModel, setting: str) -> None:
    """ValueError naming `setting` unless `model` has MoE routers (routing can be recorded)."""
    try:
        moe_routers(model)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{setting} needs an MoE model: {exc}") from exc


def check_prompt(prompt_token_ids: list[int], vocab_size: int) -> list[int]:
    """The prompt as a list of ints; ValueError when it is empty or has ids outside the vocab."""
    prompt = [int(t) for t in prompt_token_ids]
    if not prompt:
        raise ValueError("prompt_token_ids is empty")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt_token_ids has ids outside [0, {vocab_size}): {bad[:5]}")
    return prompt


def check_update(
    model: PreTrainedModel, state_dict: Mapping[str, torch.Tensor], version: int
) -> dict[str, torch.Tensor]:
    """`model`'s state dict, after checking that `state_dict` has exactly its names and shapes
    (or, for a LoRA model, only adapter tensors it has) and that `version` is >= 0 (KeyError /
    ValueError naming the first mismatch)."""
    if int(version) < 0:
        raise ValueError(f"update_weights version must be >= 0, got {version}")
    own = model.state_dict()
    if state_dict and is_peft(model) and all(is_adapter(k) for k in state_dict):
        check_partial_update(own, list(state_dict))  # a LoRA push: the adapters only
    else:
        unknown = sorted(set(state_dict) - set(own))
        missing = sorted(set(own) - set(state_dict))
        if unknown or missing:
            raise KeyError(
                f"update_weights state_dict mismatch: unknown {unknown[:5]}, missing {missing[:5]}"
            )
    for name, tensor in state_dict.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise ValueError(
                f"update_weights: {name} has shape {tuple(tensor.shape)}, engine "
                f"{tuple(own[name].shape)}"
            )
    return own
