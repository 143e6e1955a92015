"""The pure half of LoRA on the `vllm` engine (frlab.rollout.vllm.lora): the adapter
folder a push writes is the one peft itself saves (names, config; peft loads it back into an
equal model), the engine options hold the adapter's rank, and what vLLM cannot serve is
refused by name. The real engine serving it is tested in tests/vllm_cpu/test_lora_serving.py."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from frlab.model.lora import adapter_state_dict, apply_lora
from frlab.rollout.engine import EngineError
from frlab.rollout.vllm.lora import (
    ADAPTER_FILE,
    CONFIG_FILE,
    adapter_config,
    lora_engine_options,
    prune_adapters,
    write_adapter,
)

peft = pytest.importorskip("peft")


@pytest.fixture
def policy() -> Any:
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    base = AutoModelForCausalLM.from_config(config).eval()
    model = apply_lora(
        base,
        {
            "rank": 4,
            "alpha": 8.0,
            "dropout": 0.0,
            "target_modules": ["all-linear"],
            "adapter": None,
        },
    )
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
    return model


def test_the_written_adapter_is_the_folder_peft_saves(policy, tmp_path) -> None:
    config = adapter_config(policy)
    path = write_adapter(adapter_state_dict(policy.state_dict()), config, tmp_path, version=3)
    assert path == tmp_path / "adapter-v3"
    policy.save_pretrained(tmp_path / "peft")  # peft's own adapter folder
    ours, theirs = (
        load_file(str(path / ADAPTER_FILE)),
        load_file(str(tmp_path / "peft" / ADAPTER_FILE)),
    )
    assert sorted(ours) == sorted(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    saved = json.loads((tmp_path / "peft" / CONFIG_FILE).read_text())
    written = json.loads((path / CONFIG_FILE).read_text())
    for key in ("r", "lora_alpha", "target_modules", "peft_type", "bias"):
        assert (
            sorted(written[key]) == sorted(saved[key])
            if isinstance(saved[key], list)
            else written[key] == saved[key]
        )
    loaded = peft.PeftModel.from_pretrained(copy.deepcopy(policy).unload(), str(path))
    ids = torch.tensor([[1, 5, 9, 2]])
    assert torch.allclose(loaded(ids).logits, policy(ids).logits, atol=1e-6)


def test_only_adapter_tensors_are_written_and_old_folders_pruned(policy, tmp_path) -> None:
    config = adapter_config(policy)
    with pytest.raises(EngineError, match="adapter tensors only"):
        write_adapter(policy.state_dict(), config, tmp_path, version=1)
    for version in range(4):
        write_adapter(adapter_state_dict(policy.state_dict()), config, tmp_path, version)
    prune_adapters(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter-v2", "adapter-v3"]


@pytest.mark.parametrize(("rank", "expected"), [(1, 1), (4, 8), (8, 8), (33, 64), (320, 320)])
def test_the_engine_holds_the_adapters_rank(rank, expected) -> None:
    ranks = (1, 8, 16, 32, 64, 128, 256, 320, 512)
    options = lora_engine_options({"r": rank}, {"dtype": "float32"}, ranks)
    assert options == {
        "dtype": "float32",
        "enable_lora": True,
        "max_lora_rank": expected,
        "max_loras": 1,
    }
    assert lora_engine_options({"r": 4}, {"max_lora_rank": 64}, ranks)["max_lora_rank"] == 64
    with pytest.raises(EngineError, match="model.lora.rank 600"):
        lora_engine_options({"r": 600}, {}, ranks)


def test_an_adapter_of_moe_expert_parameters_is_refused_by_name() -> None:
    class Config:
        def to_dict(self) -> dict[str, Any]:
            return {
                "r": 8,
                "target_modules": {"q_proj"},
                "target_parameters": ["mlp.experts.down_proj"],
            }

    class Policy:
        peft_config = {"default": Config()}

    with pytest.raises(EngineError, match="model.lora.target_modules"):
        adapter_config(Policy())
    assert adapter_config(torch.nn.Linear(2, 2)) is None
