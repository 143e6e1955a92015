"""The chunked LM head equals the naive `model(...).logits.log_softmax` path, without [N, V].

Naive reference for sequences: `logq = log_softmax(model(ids).logits.float() / tau)`, position t
of the output holds `logq[t-1, ids[t]]`; unscored positions are 0. Values and gradients (to
hidden states, head weight and bias, and every model parameter) agree within 1e-5 in float32.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.memory import AllocationRecorder
from helpers.models import policy_of
from helpers.saved_tensors import record_saved

from frlab.model import sequence_logprobs, tiny_config
from frlab.model.lm_logprobs import lm_parts

VOCAB = 1024


# ---------------------------------------------------------------- sequence_logprobs

MODEL_CONFIGS = {
    "qwen2": lambda: tiny_config("qwen2", vocab_size=VOCAB),
    "qwen2_tied": lambda: tiny_config("qwen2", vocab_size=VOCAB, tie_word_embeddings=True),
    "llama": lambda: tiny_config("llama", vocab_size=VOCAB),
    "qwen3_moe": lambda: tiny_config("qwen3_moe", vocab_size=VOCAB),
    "phi_bias": lambda: {
        "model_type": "phi",
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 128,
    },
    "gpt2_tied": lambda: {
        "model_type": "gpt2",
        "vocab_size": VOCAB,
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 128,
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
}
_MODELS: dict[str, torch.nn.Module] = {}


def tiny_model(name: str, dtype: str = "float32") -> torch.nn.Module:
    key = f"{name}/{dtype}"
    if key not in _MODELS:
        _MODELS[key] = policy_of(config=MODEL_CONFIGS[name](), dtype=dtype, seed=0).eval()
    return _MODELS[key]


def batch(b: int = 3, t: int = 20, seed: int = 1):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (b, t), generator=g)
    lengths = torch.tensor([t, t - 6, t - 11][:b])
    attention = torch.arange(t)[None, :] < lengths[:, None]
    action = attention & (torch.arange(t)[None, :] >= 4) & (torch.rand(b, t, generator=g) < 0.7)
    return ids, attention, action


def naive_sequence(model, ids, attention, tau=1.0, action=None):  # type: ignore[no-untyped-def]
    positions = (attention.long().cumsum(1) - 1).clamp_min(0)
    logits = model(input_ids=ids, attention_mask=attention.long(), position_ids=positions).logits
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    logq = (logits.to(dtype) / tau).log_softmax(-1)[:, :-1]
    lp = logq.gather(2, ids[:, 1:, None]).squeeze(2)
    ent = -(logq.exp() * logq).sum(-1)
    score = (attention[:, 1:] & attention[:, :-1]) if action is None else action[:, 1:]
    zero = torch.zeros((), dtype=dtype)
    return (
        F.pad(torch.where(score, lp, zero), (1, 0)),
        F.pad(torch.where(score, ent, zero), (1, 0)),
    )


def model_grads(model, loss):  # type: ignore[no-untyped-def]
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.autograd.grad(loss, params, allow_unused=True)


@pytest.mark.slow  # six architectures x two masks; each first forward warms up its kernels
@pytest.mark.parametrize("name", sorted(MODEL_CONFIGS))
@pytest.mark.parametrize("use_action_mask", [False, True])
def test_sequence_matches_naive_values_and_param_grads(name: str, use_action_mask: bool) -> None:
    model = tiny_model(name)
    ids, attention, action = batch()
    action_mask = action if use_action_mask else None
    lp, ent = sequence_logprobs(
        model,
        ids,
        attention,
        temperature=0.9,
        chunk_size=7,
        compute_entropy=True,
        action_mask=action_mask,
    )
    ref_lp, ref_ent = naive_sequence(model, ids, attention, 0.9, action_mask)
    assert lp.shape == ids.shape and lp.dtype == torch.float32
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)
    assert (lp[:, 0] == 0).all() and (lp[~attention] == 0).all()
    if use_action_mask:
        assert (lp[~action] == 0).all() and (lp[action] < 0).all()
    coef = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3))
    grads = model_grads(model, (coef * lp).sum())
    ref_grads = model_grads(model, (coef * ref_lp).sum())
    for got, want in zip(grads, ref_grads, strict=True):
        if want is None:
            assert got is None or not got.any()
            continue
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_tied_head_grad_includes_embedding_path() -> None:
    model = tiny_model("qwen2_tied")
    _, head = lm_parts(model)
    assert head.weight is model.get_input_embeddings().weight
    ids, attention, _ = batch()
    lp, _ = sequence_logprobs(model, ids, attention, chunk_size=5)
    (grad,) = torch.autograd.grad(lp.sum(), head.weight)
    (ref_grad,) = torch.autograd.grad(naive_sequence(model, ids, attention)[0].sum(), head.weight)
    torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=0)


def test_float64_model_outputs_float64() -> None:
    model = tiny_model("llama", dtype="float64")
    ids, attention, action = batch()
    lp, ent = sequence_logprobs(model, ids, attention, action_mask=action, compute_entropy=True)
    ref_lp, ref_ent = naive_sequence(model, ids, attention, action=action)
    assert lp.dtype == ent.dtype == torch.float64
    torch.testing.assert_close(lp, ref_lp, atol=1e-10, rtol=0)


def test_explicit_position_ids_are_used() -> None:
    model = tiny_model("qwen2")
    ids, attention, _ = batch()
    stretched = (attention.long().cumsum(1) - 1).clamp_min(0) * 3  # RoPE sees other distances
    lp, _ = sequence_logprobs(model, ids, attention, stretched)
    default, _ = sequence_logprobs(model, ids, attention)
    assert not torch.allclose(lp, default, atol=1e-4)
    ref, _ = naive_sequence(model, ids, attention)
    torch.testing.assert_close(default, ref, atol=1e-5, rtol=0)


def test_sequence_saves_no_tensor_of_size_n_times_v() -> None:
    """N = B*T = 96 > H = 64, so the head weight (V*H) is smaller than N*V; the naive path
    saves [B, T, V] logits and is caught by the same check."""
    model = tiny_model("qwen2")
    ids, attention, action = batch(b=2, t=48)
    n_times_v = ids.numel() * VOCAB
    rec = AllocationRecorder()
    with rec:
        (lp, _), saved = record_saved(
            lambda: sequence_logprobs(model, ids, attention, chunk_size=16)
        )
        lp.sum().backward()
    model.zero_grad(set_to_none=True)
    assert max(saved) < n_times_v
    assert max(numel for _, _, numel in rec.allocs) < n_times_v
    _, naive_saved = record_saved(lambda: naive_sequence(model, ids, attention))
    assert max(naive_saved) >= n_times_v


@pytest.mark.parametrize(
    ("model_type", "extra"),
    [
        ("gemma2", {"head_dim": 16, "final_logit_softcapping": 30.0}),
        ("granite", {"logits_scaling": 8.0}),
    ],
)
def test_refuses_models_that_transform_logits(model_type: str, extra: dict) -> None:
    config = {
        "model_type": model_type,
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        **extra,
    }
    model = policy_of(config=config, seed=0)
    ids = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=model_type):
        sequence_logprobs(model, ids, torch.ones(1, 4, dtype=torch.bool))


def test_refuses_a_module_without_lm_head() -> None:
    with pytest.raises(ValueError, match="no base decoder"):
        sequence_logprobs(torch.nn.Linear(2, 2), torch.zeros(1, 2, dtype=torch.long), None)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"input_ids": torch.zeros(3, 20)}, "input_ids"),
        ({"attention_mask": torch.ones(3, 19, dtype=torch.bool)}, "attention_mask"),
        ({"attention_mask": None}, "attention_mask"),
        ({"position_ids": torch.zeros(2, 20, dtype=torch.long)}, "position_ids"),
        ({"action_mask": torch.ones(3, 20, dtype=torch.long)}, "action_mask"),
        ({"action_mask": torch.ones(3, 20, dtype=torch.bool)}, r"action_mask\[:, 0\]"),
        ({"action_mask": "padding"}, "padding"),
    ],
)
def test_sequence_validation(change: dict, field: str) -> None:
    ids, attention, action = batch()
    args = {"input_ids": ids, "attention_mask": attention, "position_ids": None}
    if isinstance(change.get("action_mask"), str):
        bad = action.clone()
        bad[2, -1] = True  # row 2 is padding there
        change = {"action_mask": bad}
    args.update(change)
    with pytest.raises(ValueError, match=field):
        sequence_logprobs(tiny_model("qwen2"), **args)


def test_no_scored_position_gives_zeros_and_zero_grads() -> None:
    model = tiny_model("qwen2")
    ids, attention, _ = batch()
    none = torch.zeros_like(attention)
    lp, ent = sequence_logprobs(model, ids, attention, action_mask=none, compute_entropy=True)
    assert lp.shape == ids.shape and not lp.any() and not ent.any()
    (grad,) = torch.autograd.grad(lp.sum(), model.lm_head.weight)
    assert not grad.any()
