"""Policy building, loading, saving: tiny configs, seeds, dtypes, errors, offline hub ids."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.models import policy_of
from omegaconf import OmegaConf

from frlab.model import ModelNotCachedError, save_policy, tiny_config
from frlab.model.policy import checkpoint_policy

TYPES = ["qwen2", "llama", "qwen3_moe"]


@pytest.mark.parametrize("model_type", TYPES)
def test_tiny_config_is_tiny(model_type: str) -> None:
    cfg = tiny_config(model_type)
    assert cfg.model_type == model_type
    assert cfg.hidden_size == 64 and cfg.num_hidden_layers == 2
    assert 64 <= cfg.vocab_size <= 1024
    if model_type == "qwen3_moe":
        assert (cfg.num_experts, cfg.num_experts_per_tok) == (4, 2)
    assert tiny_config(model_type, vocab_size=100).vocab_size == 100


def test_tiny_config_unknown_type() -> None:
    with pytest.raises(ValueError, match="model_type 'gpt5'"):
        tiny_config("gpt5")


def test_tiny_moe_model_routes_to_experts() -> None:
    model = policy_of(config=tiny_config("qwen3_moe"), seed=0)
    mlp = model.model.layers[0].mlp
    assert "Moe" in type(mlp).__name__
    assert sum(p.numel() for p in model.parameters()) < 2_000_000


def params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_seed_makes_init_reproducible_without_touching_global_rng() -> None:
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = params(policy_of(config={"model_type": "llama", **small()}, seed=7))
    assert torch.equal(torch.get_rng_state(), before)
    b = params(policy_of(config={"model_type": "llama", **small()}, seed=7))
    c = params(policy_of(config={"model_type": "llama", **small()}, seed=8))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))


def small() -> dict:
    return {
        "vocab_size": 96,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    }


def test_omegaconf_mapping_and_dtype() -> None:
    cfg = OmegaConf.create({"model_type": "qwen2", **small()})
    model = policy_of(config=cfg, dtype="bfloat16", seed=0)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.config.vocab_size == 96


def test_default_attention_is_sdpa_on_cpu_too_and_a_choice_is_kept() -> None:
    model = policy_of(config=tiny_config("qwen2"), seed=0)
    assert model.config._attn_implementation == "sdpa"
    eager = policy_of(config=tiny_config("qwen2"), seed=0, attn_implementation="eager")
    assert eager.config._attn_implementation == "eager"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sdpa_and_eager_agree_on_padded_batches(dtype: torch.dtype) -> None:
    """The CPU default (sdpa) against eager: same log-probs and gradients to float32 rounding
    (transformers' eager attention takes its softmax in float32, even for float64 models), and
    no NaN from padded positions."""
    from frlab.model.lm_logprobs import sequence_logprobs

    lengths = torch.tensor([3, 11, 7, 16])
    mask = torch.arange(16)[None] < lengths[:, None]
    ids = torch.where(
        mask, torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(0)), 0
    )
    out = {}
    for attn in ("sdpa", "eager"):
        model = policy_of(config=tiny_config("qwen2"), seed=0, attn_implementation=attn)
        model = model.to(dtype)
        lp, ent = sequence_logprobs(model, ids, mask, compute_entropy=True)
        lp.sum().backward()
        out[attn] = (lp.detach(), ent, [p.grad for p in model.parameters()])
    torch.testing.assert_close(out["sdpa"][0], out["eager"][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["sdpa"][1], out["eager"][1], rtol=1e-5, atol=1e-5)
    for a, b in zip(out["sdpa"][2], out["eager"][2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert all(bool(torch.isfinite(g).all()) for g in out["sdpa"][2])


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({}, "model.name_or_path .* or model.config"),
        ({"config": tiny_config(), "dtype": "bfloat61"}, r"model.dtype`: 'bfloat61' is not"),
        ({"config": tiny_config(), "dtype": "int8"}, "model.dtype"),
        ({"config": {"vocab_size": 10}}, "model.config.model_type`: is required"),
        ({"config": {"model_type": "qwen"}}, r"model.config.model_type`: 'qwen'.*did you mean"),
        ({"config": ["qwen2"]}, "model.config`: must be a mapping"),
        ({"config": tiny_config(), "seed": "0"}, "seed"),
        ({"name_or_path": "/nonexistent/frlab/model"}, "model.name_or_path`: .* not an existing"),
        ({"name_or_path": "x/y", "config": {"model_type": "qwen2"}}, "not both"),
    ],
)
def test_bad_input_names_the_field(kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        policy_of(**kwargs)


def test_undeclared_config_key_warns_with_close_match() -> None:
    with pytest.warns(UserWarning, match=r"model.config.hidden_sise .*'hidden_size'"):
        policy_of(config={"model_type": "qwen2", **small(), "hidden_sise": 8}, seed=0)


def test_uncached_hub_id_while_offline_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelNotCachedError, match="not in the local .*cache.*HF_HUB_OFFLINE"):
        policy_of("frlab-tests/no-such-model-anywhere")


@pytest.mark.parametrize("model_type", TYPES)
def test_save_and_reload_by_local_path_gives_identical_logits(
    model_type: str, tmp_path: Path
) -> None:
    model = policy_of(config=tiny_config(model_type), seed=0).eval()
    out = save_policy(model, tmp_path / "policy")
    assert (out / "config.json").is_file()
    assert list(out.glob("*.safetensors"))
    again = policy_of(str(out)).eval()
    assert again.config.model_type == model_type
    ids = torch.randint(
        0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, again(input_ids=ids).logits)
    half = policy_of(str(out), dtype="bfloat16")
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}


def checkpointing_enabled(model: torch.nn.Module) -> bool:
    """Whether activation (gradient) checkpointing is on, under either transformers name."""
    if hasattr(type(model), "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(model.is_gradient_checkpointing)


def test_gradient_checkpointing_keeps_gradients(tmp_path: Path) -> None:
    from frlab.model import sequence_logprobs

    plain = policy_of(config=tiny_config("qwen2"), seed=0)
    ckpt = policy_of(config=tiny_config("qwen2"), seed=0, gradient_checkpointing=True)
    assert checkpointing_enabled(ckpt) and not checkpointing_enabled(plain)
    assert ckpt.config.use_cache is False
    later = policy_of(config=tiny_config("qwen2"), seed=0)
    checkpoint_policy(later)  # model.gradient_checkpointing=auto turns it on after the build
    assert checkpointing_enabled(later) and later.config.use_cache is False
    ids = torch.randint(0, 256, (2, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 10, dtype=torch.bool)
    grads = []
    for model in (plain.train(), ckpt.train()):
        lp, _ = sequence_logprobs(model, ids, mask)
        grads.append(torch.autograd.grad(lp.sum(), list(model.parameters())))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_import_frlab_model_is_lazy() -> None:
    code = (
        "import sys, frlab.model as m; "
        "assert 'transformers' not in sys.modules, 'transformers imported'; "
        "assert 'build_policy' in dir(m); print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    with pytest.raises(AttributeError, match="no_such_name"):
        import frlab.model

        _ = frlab.model.no_such_name  # type: ignore[attr-defined]
